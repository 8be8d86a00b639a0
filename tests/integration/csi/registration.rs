//! Kubelet plugin registration against the real binary: the registration socket is
//! where kubelet's plugin watcher looks, answers GetInfo and NotifyRegistrationStatus
//! through the generated client exactly as kubelet calls them, comes back when the
//! registry directory is wiped, and is removed at shutdown.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use drivelet::grpc::proto::registration::{registration_client::RegistrationClient, InfoRequest, RegistrationStatus};

async fn client(sock: &Path) -> RegistrationClient<tonic::transport::Channel> {
    RegistrationClient::new(channel(sock).await.unwrap_or_else(|e| panic!("connect {}: {e}", sock.display())))
}

/// Waits up to `within` for `f`; false when it never held.
fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    loop {
        if f() {
            return true;
        }
        if t0.elapsed() >= within {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn kubelet_learns_the_csi_endpoint_and_its_status_reports_are_logged() {
    require_host();
    let tmp = short_tempdir();
    let (mut agent, sock) = Agent::start_registering(tmp.path());
    assert!(is_socket(&sock), "no registration socket at {}; log:\n{}", sock.display(), agent.log_tail(20));
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "registration socket mode {mode:o}");
    rt().block_on(async {
        let mut reg = client(&sock).await;
        let info = reg.get_info(InfoRequest {}).await.expect("GetInfo").into_inner();
        assert_eq!(info.r#type, "CSIPlugin");
        assert_eq!(info.name, "csi.drivelet.io");
        assert_eq!(Path::new(&info.endpoint), agent.csi_socket.as_path());
        assert_eq!(info.supported_versions, vec!["1.0.0".to_string()]);
        // The endpoint it names is the CSI socket that answers.
        let mut csi = Csi::connect(&agent).await;
        let name = csi.id.get_plugin_info(drivelet::grpc::proto::csi::GetPluginInfoRequest {}).await.unwrap().into_inner().name;
        assert_eq!(name, info.name);

        reg.notify_registration_status(RegistrationStatus { plugin_registered: true, error: String::new() })
            .await
            .expect("NotifyRegistrationStatus registered");
        let why = "plugin csi.drivelet.io failed validation: test-made refusal 7f3a";
        reg.notify_registration_status(RegistrationStatus { plugin_registered: false, error: why.into() })
            .await
            .expect("NotifyRegistrationStatus not registered");
    });
    let logged = eventually(Duration::from_secs(3), || {
        let log = agent.logs();
        log.lines().any(|l| l.contains("kubelet registered the plugin") && l.contains("\"INFO\""))
            && log.lines().any(|l| l.contains("kubelet failed to register the plugin") && l.contains("\"ERROR\"") && l.contains("test-made refusal 7f3a"))
    });
    assert!(logged, "both reports should be logged (info, then error with kubelet's error); log:\n{}", agent.log_tail(20));

    assert_eq!(agent.stop(), 0, "log:\n{}", agent.log_tail(20));
    assert!(!sock.exists(), "the registration socket is removed at shutdown, so kubelet deregisters the plugin");
}

#[test]
fn a_wiped_plugin_registry_gets_the_socket_back_within_five_seconds() {
    require_host();
    let tmp = short_tempdir();
    let (mut agent, sock) = Agent::start_registering(tmp.path());
    assert!(is_socket(&sock), "no registration socket; log:\n{}", agent.log_tail(20));
    // What a kubelet restart with a cleaned root directory does.
    std::fs::remove_dir_all(sock.parent().unwrap()).unwrap();
    let t0 = Instant::now();
    let back = eventually(Duration::from_secs(5), || is_socket(&sock));
    assert!(back, "the registration socket did not come back within 5 s; log:\n{}", agent.log_tail(20));
    let took = t0.elapsed();
    rt().block_on(async {
        let info = client(&sock).await.get_info(InfoRequest {}).await.expect("GetInfo on the new socket").into_inner();
        assert_eq!(info.name, "csi.drivelet.io");
        assert_eq!(Path::new(&info.endpoint), agent.csi_socket.as_path());
    });
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "re-created socket mode {mode:o}");
    assert!(agent.logs().contains("registration socket is gone"), "the re-creation is logged (took {took:?})");

    // Again: the watcher keeps watching the new socket.
    std::fs::remove_file(&sock).unwrap();
    assert!(eventually(Duration::from_secs(5), || is_socket(&sock)), "a second removal was not repaired");
    rt().block_on(async {
        client(&sock).await.get_info(InfoRequest {}).await.expect("GetInfo after the second re-creation");
    });
    assert_eq!(agent.stop(), 0, "log:\n{}", agent.log_tail(20));
    assert!(!sock.exists(), "the registration socket is removed at shutdown");
}

#[test]
fn registration_is_off_unless_configured() {
    require_host();
    let tmp = short_tempdir();
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    assert_eq!(agent.stop(), 0);
    let log = agent.logs();
    assert!(log.contains("drivelet stopped"), "{}", agent.log_tail(20));
    assert!(!log.contains("serving kubelet plugin registration"), "registration is off by default; log:\n{}", agent.log_tail(20));
}
