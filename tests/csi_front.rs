//! The CSI front over the real socket: Identity, NodeGetInfo, capabilities and
//! GetCapacity checked field by field; bad input gets the right code; the process
//! starts, refuses and stops the way an operator expects.

mod common;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use common::*;
use drivelet::grpc::proto::csi::{
    self, controller_client::ControllerClient, identity_client::IdentityClient, node_client::NodeClient,
};
use tonic::Code;

const MIB: i64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn params(kv: &[(&str, &str)]) -> HashMap<String, String> {
    kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn topo(kv: &[(&str, &str)]) -> Option<csi::Topology> {
    Some(csi::Topology { segments: params(kv) })
}

fn cap(mode: csi::volume_capability::access_mode::Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
        access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
    }
}

#[test]
fn identity_node_and_capacity_answer_field_by_field() {
    require_host();
    let tmp = short_tempdir();
    let _a = LoopDrive::new(tmp.path(), "a.img", GIB);
    let _b = LoopDrive::new(tmp.path(), "b.img", 2 * GIB);
    let with_fs = LoopDrive::new(tmp.path(), "c.img", GIB);
    sh("mkfs.ext4", &["-q", "-F", with_fs.dev.to_str().unwrap()]);
    sh("udevadm", &["settle"]);
    let agent = Agent::start(tmp.path(), AgentOpts::default());
    rt().block_on(async {
        let ch = agent.csi().await;
        let mut id = IdentityClient::new(ch.clone());
        let info = id.get_plugin_info(csi::GetPluginInfoRequest {}).await.unwrap().into_inner();
        assert_eq!(info.name, "csi.drivelet.io");
        assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
        assert_eq!(info.manifest.get("node").map(String::as_str), Some(NODE));

        let caps = id.get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {}).await.unwrap().into_inner();
        use csi::plugin_capability::{service::Type as S, volume_expansion::Type as VE, Type};
        let got: Vec<String> = caps
            .capabilities
            .iter()
            .map(|c| match &c.r#type {
                Some(Type::Service(s)) => format!("service {}", s.r#type),
                Some(Type::VolumeExpansion(e)) => format!("expansion {}", e.r#type),
                other => panic!("unexpected capability {other:?}"),
            })
            .collect();
        let want = [
            format!("service {}", S::ControllerService as i32),
            format!("service {}", S::VolumeAccessibilityConstraints as i32),
            format!("expansion {}", VE::Online as i32),
        ];
        assert_eq!(got, want);
        assert_eq!(id.probe(csi::ProbeRequest {}).await.unwrap().into_inner().ready, Some(true));

        let mut node = NodeClient::new(ch.clone());
        let ni = node.node_get_info(csi::NodeGetInfoRequest {}).await.unwrap().into_inner();
        assert_eq!(ni.node_id, NODE);
        assert_eq!(ni.max_volumes_per_node, 0);
        assert_eq!(
            ni.accessible_topology.unwrap().segments,
            params(&[("topology.drivelet.io/node", NODE), ("topology.kubernetes.io/zone", "zone-a")])
        );
        let nc = node.node_get_capabilities(csi::NodeGetCapabilitiesRequest {}).await.unwrap().into_inner();
        use csi::node_service_capability::{rpc::Type as NR, Type as NT};
        let got: Vec<i32> = nc
            .capabilities
            .iter()
            .map(|c| match &c.r#type {
                Some(NT::Rpc(r)) => r.r#type,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(
            got,
            vec![
                NR::StageUnstageVolume as i32,
                NR::SingleNodeMultiWriter as i32,
                NR::GetVolumeStats as i32,
                NR::VolumeCondition as i32,
                NR::ExpandVolume as i32
            ]
        );

        let mut ctrl = ControllerClient::new(ch.clone());
        let cc = ctrl.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {}).await.unwrap().into_inner();
        use csi::controller_service_capability::{rpc::Type as R, Type as CT};
        let got: Vec<i32> = cc
            .capabilities
            .iter()
            .map(|c| match &c.r#type {
                Some(CT::Rpc(r)) => r.r#type,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(
            got,
            vec![
                R::CreateDeleteVolume as i32,
                R::PublishUnpublishVolume as i32,
                R::GetCapacity as i32,
                R::SingleNodeMultiWriter as i32,
                R::ListVolumes as i32,
                R::ListVolumesPublishedNodes as i32,
                R::GetVolume as i32,
                R::VolumeCondition as i32,
                R::ExpandVolume as i32,
                R::CloneVolume as i32,
            ]
        );

        // Two blank drives: 1022 MiB + 2046 MiB usable; the ext4 drive counts for nothing.
        let get = |req: csi::GetCapacityRequest| {
            let mut c = ctrl.clone();
            async move { c.get_capacity(req).await }
        };
        let all = get(csi::GetCapacityRequest::default()).await.unwrap().into_inner();
        assert_eq!(all.available_capacity, 3068 * MIB);
        assert_eq!(all.maximum_volume_size, Some(2046 * MIB));
        assert_eq!(all.minimum_volume_size, Some(MIB), "no capability: a block volume's minimum");

        let ours = get(csi::GetCapacityRequest {
            accessible_topology: topo(&[("topology.drivelet.io/node", NODE)]),
            parameters: params(&[("media", "virtual"), ("csi.storage.k8s.io/fstype", "ext4")]),
            volume_capabilities: vec![cap(csi::volume_capability::access_mode::Mode::SingleNodeWriter)],
        })
        .await
        .unwrap()
        .into_inner();
        assert_eq!(ours.available_capacity, 3068 * MIB);

        let whole = get(csi::GetCapacityRequest { parameters: params(&[("layout", "drive")]), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!((whole.available_capacity, whole.maximum_volume_size), (3068 * MIB, Some(2046 * MIB)));

        for (why, req) in [
            ("other node", csi::GetCapacityRequest { accessible_topology: topo(&[("topology.drivelet.io/node", "elsewhere")]), ..Default::default() }),
            ("other zone", csi::GetCapacityRequest { accessible_topology: topo(&[("topology.kubernetes.io/zone", "zone-b")]), ..Default::default() }),
            ("unknown key", csi::GetCapacityRequest { accessible_topology: topo(&[("rack", "r1")]), ..Default::default() }),
            ("no ssd", csi::GetCapacityRequest { parameters: params(&[("media", "ssd")]), ..Default::default() }),
            ("multi-node", csi::GetCapacityRequest {
                volume_capabilities: vec![cap(csi::volume_capability::access_mode::Mode::MultiNodeMultiWriter)],
                ..Default::default()
            }),
        ] {
            let r = get(req).await.unwrap().into_inner();
            assert_eq!(r.available_capacity, 0, "{why}");
            assert_eq!(r.maximum_volume_size, Some(0), "{why}");
        }

        for (why, req) in [
            ("unknown parameter", csi::GetCapacityRequest { parameters: params(&[("meda", "ssd")]), ..Default::default() }),
            ("bad media", csi::GetCapacityRequest { parameters: params(&[("media", "tape")]), ..Default::default() }),
            ("no access mode", csi::GetCapacityRequest {
                volume_capabilities: vec![csi::VolumeCapability { access_mode: None, access_type: None }],
                ..Default::default()
            }),
        ] {
            let e = get(req).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{why}: {e:?}");
            assert!(!e.message().is_empty());
        }

        // Not implemented: UNIMPLEMENTED, and not advertised above.
        let e = ctrl
            .create_snapshot(csi::CreateSnapshotRequest { source_volume_id: "v".into(), name: "s".into(), ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unimplemented);
        // Expansion is served: a request without a capacity range is refused, not unknown.
        let e = ctrl
            .controller_expand_volume(csi::ControllerExpandVolumeRequest { volume_id: "v".into(), ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        let e = node.node_expand_volume(csi::NodeExpandVolumeRequest::default()).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
    });
}

#[test]
fn sockets_are_owner_only_and_stale_ones_are_replaced() {
    require_host();
    let tmp = short_tempdir();
    // A stale socket from a crashed run.
    let stale = std::os::unix::net::UnixListener::bind(tmp.path().join("csi.sock")).unwrap();
    drop(stale);
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    for s in [&agent.csi_socket, &agent.admin_socket] {
        let mode = std::fs::metadata(s).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{} mode {mode:o}", s.display());
    }
    // A second agent on the same sockets refuses to start and says why.
    let out = Command::new(bin()).args(["run", "--config", agent.config.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by another running process"), "{err}");
    assert!(is_socket(&agent.csi_socket), "the running agent's socket was left alone");
    assert_eq!(agent.stop(), 0);
}

fn check_config(toml: &str, env: &[(&str, &str)]) -> (i32, String) {
    let tmp = short_tempdir();
    let p = tmp.path().join("c.toml");
    std::fs::write(&p, toml).unwrap();
    let out = Command::new(bin())
        .args(["check-config", p.to_str().unwrap()])
        .env("NODE_NAME", "n1")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn check_config_accepts_good_files_and_names_the_key_in_bad_ones() {
    let root = env!("CARGO_MANIFEST_DIR");
    for f in ["config/drivelet.toml", "config/demo.toml"] {
        let out = Command::new(bin()).args(["check-config", &format!("{root}/{f}")]).env("NODE_NAME", "n1").output().unwrap();
        assert!(out.status.success(), "{f}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let (code, out) = check_config("", &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("node n1"), "NODE_NAME is the node name: {out}");

    let cases: &[(&str, &[(&str, &str)], &str)] = &[
        ("[driver]\nnmae = \"x\"\n", &[], "nmae"),
        ("[drives.filters]\nmin_size = \"lots\"\n", &[], "not a size"),
        ("[drives]\nrescan_interval = \"often\"\n", &[], "not a duration"),
        ("[paths]\ncsi_socket = \"rel/csi.sock\"\n", &[], "paths.csi_socket"),
        ("[driver]\nname = \"bad_name!\"\n", &[], "driver.name"),
        ("", &[("DRIVELET__DRIVER__NAME", "-nope-")], "driver.name"),
        ("", &[("DRIVELET__DRIVES__ALLOW_LOOP", "maybe")], "allow_loop"),
        ("[demo]\nenabled = true\n", &[], "drives.allow_loop"),
        ("this is not toml", &[], "c.toml"),
    ];
    for (toml, env, want) in cases {
        let (code, out) = check_config(toml, env);
        assert_eq!(code, 1, "{toml:?} {env:?} should be rejected: {out}");
        assert!(out.contains(want), "{toml:?} {env:?}: message should mention {want:?}: {out}");
        assert!(!out.contains("panicked"), "{out}");
    }
    let (code, out) = check_config("", &[("DRIVELET__DRIVER__NODE_NAME", "from-env")]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("node from-env"), "{out}");
}

#[test]
fn startup_errors_are_clear_and_change_nothing() {
    require_host();
    let tmp = short_tempdir();
    // The socket directory cannot be created: a regular file sits where it should be.
    std::fs::write(tmp.path().join("blocker"), b"keep me").unwrap();
    let cfg = tmp.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[driver]\nnode_name = \"n\"\n[paths]\ncsi_socket = \"{d}/blocker/csi.sock\"\nadmin_socket = \"{d}/admin.sock\"\nstate_dir = \"{d}/state\"\n",
            d = tmp.path().display()
        ),
    )
    .unwrap();
    let out = Command::new(bin()).args(["run", "--config", cfg.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot create socket directory") && err.contains("blocker"), "{err}");
    assert_eq!(std::fs::read(tmp.path().join("blocker")).unwrap(), b"keep me");

    // A regular file at the socket path is never deleted.
    std::fs::write(tmp.path().join("csi.sock"), b"not a socket").unwrap();
    std::fs::write(
        &cfg,
        format!(
            "[driver]\nnode_name = \"n\"\n[paths]\ncsi_socket = \"{d}/csi.sock\"\nadmin_socket = \"{d}/admin.sock\"\nstate_dir = \"{d}/state\"\n",
            d = tmp.path().display()
        ),
    )
    .unwrap();
    let out = Command::new(bin()).args(["run", "--config", cfg.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not a socket"), "{err}");
    assert_eq!(std::fs::read(tmp.path().join("csi.sock")).unwrap(), b"not a socket");
}

#[test]
fn help_documents_every_command() {
    let out = Command::new(bin()).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for cmd in ["run", "check-config", "ctl", "csi"] {
        assert!(help.contains(cmd), "{cmd} missing from --help:\n{help}");
    }
    let out = Command::new(bin()).args(["ctl", "--help"]).output().unwrap();
    let ctl = String::from_utf8_lossy(&out.stdout);
    assert!(ctl.contains("drives") && ctl.contains("volumes"), "{ctl}");
    let out = Command::new(bin()).args(["csi", "--help"]).output().unwrap();
    let csi = String::from_utf8_lossy(&out.stdout);
    for sub in ["create", "delete", "get", "list", "validate", "capacity", "stage", "unstage", "publish", "unpublish", "stats", "info"] {
        assert!(csi.contains(sub), "csi {sub} missing:\n{csi}");
    }
}

#[test]
fn csi_cli_prints_capabilities_by_their_csi_names_and_sizes_in_binary_units() {
    require_host();
    let tmp = short_tempdir();
    let _a = LoopDrive::new(tmp.path(), "a.img", 2 * GIB);
    let agent = Agent::start(tmp.path(), AgentOpts::default());
    let csi = |args: &[&str]| {
        let sock = agent.csi_socket.display().to_string();
        let out = Command::new(bin()).args(["csi", "--endpoint", sock.as_str()]).args(args).output().unwrap();
        assert!(out.status.success(), "csi {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let info = csi(&["info"]);
    for want in [
        "plugin_capabilities: CONTROLLER_SERVICE, VOLUME_ACCESSIBILITY_CONSTRAINTS, VOLUME_EXPANSION_ONLINE\n",
        "CREATE_DELETE_VOLUME",
        "GET_CAPACITY",
        "STAGE_UNSTAGE_VOLUME",
        "ready: true\n",
        "topology: topology.drivelet.io/node=test-node, topology.kubernetes.io/zone=zone-a\n",
    ] {
        assert!(info.contains(want), "{want:?} not in:\n{info}");
    }
    for debug in ["Some(", "Rpc", "r#type", "{"] {
        assert!(!info.contains(debug), "Debug output {debug:?} in:\n{info}");
    }
    let cap = csi(&["capacity"]);
    assert!(cap.contains("available_capacity: 2.0 GiB\n") && cap.contains("maximum_volume_size: 2.0 GiB\n"), "{cap}");
    // JSON keeps the exact bytes.
    let json: serde_json::Value = serde_json::from_str(&csi(&["-o", "json", "capacity"])).unwrap();
    assert!(json["available_capacity"].as_u64().is_some_and(|b| b > GIB && b <= 2 * GIB), "{json}");
}
