//! The Controller service's volume calls: CreateVolume, DeleteVolume,
//! ValidateVolumeCapabilities and GetCapacity held to their error tables, topology
//! requirements and whole-drive volumes. Every test runs over a 1 GiB and a 2 GiB drive.

use crate::common::*;
use super::harness::*;
use drivelet::grpc::proto::csi;
use drivelet::grpc::proto::csi::volume_capability::access_mode::Mode;
use drivelet::grpc::proto::csi::volume_capability::AccessMode;
use tonic::Code;

#[test]
fn get_capacity_bounds_are_sizes_create_volume_accepts() {
    conform(&[GIB, 2 * GIB], async |fx, c, r| {
        let (small, large) = (usable(GIB), usable(2 * GIB));
        let clean = fx.state();
        assert!(clean.parts.iter().all(|p| p.is_empty()), "test drives start blank: {clean:?}");

        // --- GetCapacity, and that its bounds are ones CreateVolume honours.
        let all = must("GetCapacity", c.ctrl.get_capacity(csi::GetCapacityRequest::default()).await);
        r.check(all.available_capacity == small + large, || format!("available_capacity {} of two blank drives, want {}", all.available_capacity, small + large));
        r.check(all.maximum_volume_size.is_none_or(|m| (0..=all.available_capacity).contains(&m)), || {
            format!("maximum_volume_size {:?} is negative or above available {}", all.maximum_volume_size, all.available_capacity)
        });
        if let Some(max) = all.maximum_volume_size {
            // The largest size that may be used as required_bytes [GetCapacityResponse].
            let v = r.ok("CreateVolume with required_bytes = maximum_volume_size", c.ctrl.create_volume(vol_req("conf-c-max", max, 0, vec![mount_cap("")], &[])).await);
            if let Some(v) = created(r, "CreateVolume at maximum_volume_size", v, max, 0) {
                must("DeleteVolume", c.ctrl.delete_volume(del_req(&v.volume_id)).await);
            }
        }
        for (fs, cap) in [("block", block_cap()), ("ext4", mount_cap("ext4")), ("xfs", mount_cap("xfs"))] {
            // The smallest size that may be used as limit_bytes with these capabilities
            // [GetCapacityResponse: the plugin SHALL take the capabilities into account].
            let g = must("GetCapacity", c.ctrl.get_capacity(csi::GetCapacityRequest { volume_capabilities: vec![cap.clone()], ..Default::default() }).await);
            let Some(min) = g.minimum_volume_size else { continue };
            r.check(min >= 0, || format!("minimum_volume_size {min} is negative"));
            let what = format!("CreateVolume {fs} with limit_bytes = minimum_volume_size {min}");
            let v = r.ok(&what, c.ctrl.create_volume(vol_req(&format!("conf-c-min-{fs}"), 0, min, vec![cap], &[])).await);
            if let Some(v) = created(r, &what, v, 0, min) {
                must("DeleteVolume", c.ctrl.delete_volume(del_req(&v.volume_id)).await);
            }
        }
        r.unchanged("GetCapacity bound checks", &fx, &clean);
        // Let the inventory catch up with those creates and deletes before placing more.
        let (now, settled) = capacity_settles(c, csi::GetCapacityRequest::default(), |g| g.available_capacity == all.available_capacity).await;
        r.check(settled, || format!("available_capacity {} 10 s after the volumes were deleted, want {}", now.available_capacity, all.available_capacity));
    });
}

#[test]
fn create_volume_with_bad_input_is_invalid_argument_and_changes_nothing() {
    conform(&[GIB, 2 * GIB], async |fx, c, r| {
        let clean = fx.state();
        // --- CreateVolume: bad input is INVALID_ARGUMENT and changes nothing.
        let good = || vol_req("conf-c-bad", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[]);
        let with = |f: &dyn Fn(&mut csi::CreateVolumeRequest)| {
            let mut q = good();
            f(&mut q);
            q
        };
        let caps = |v: Vec<csi::VolumeCapability>| with(&move |q| q.volume_capabilities = v.clone());
        let cap_with = |f: &dyn Fn(&mut csi::VolumeCapability)| {
            let mut cap = mount_cap("ext4");
            f(&mut cap);
            caps(vec![cap])
        };
        let src = |t: csi::volume_content_source::Type| with(&move |q| q.volume_content_source = Some(csi::VolumeContentSource { r#type: Some(t.clone()) }));
        let range = |req: i64, lim: i64| with(&move |q| q.capacity_range = Some(csi::CapacityRange { required_bytes: req, limit_bytes: lim }));
        let params = |p: &[(&str, &str)]| {
            let p = kv(p);
            with(&move |q| q.parameters = p.clone())
        };
        let named = |n: String| with(&move |q| q.name = n.clone());
        // (case, request, words its message must hold: the value asked for and what
        // would be accepted)
        let invalid: Vec<(&str, csi::CreateVolumeRequest, &[&str])> = vec![
            ("no name", named(String::new()), &["name is required"]),
            ("no volume_capabilities", caps(vec![]), &["volume_capabilities is required"]),
            ("a capability without access_mode", cap_with(&|c| c.access_mode = None), &["no access_mode", "ReadWriteOnce"]),
            ("a capability without access_type", cap_with(&|c| c.access_type = None), &["neither block nor mount", "ext4 or xfs"]),
            ("access mode UNKNOWN", cap_with(&|c| c.access_mode = Some(AccessMode { mode: Mode::Unknown as i32 })), &["UNKNOWN", "SINGLE_NODE_WRITER"]),
            ("access mode 99 (not in the enum)", cap_with(&|c| c.access_mode = Some(AccessMode { mode: 99 })), &["access mode 99", "SINGLE_NODE_WRITER"]),
            ("MULTI_NODE_READER_ONLY", caps(vec![mount(Mode::MultiNodeReaderOnly, "ext4", &[])]), &["MULTI_NODE_READER_ONLY", "ReadOnlyMany", "SINGLE_NODE_WRITER"]),
            ("MULTI_NODE_SINGLE_WRITER", caps(vec![mount(Mode::MultiNodeSingleWriter, "ext4", &[])]), &["MULTI_NODE_SINGLE_WRITER", "SINGLE_NODE_WRITER"]),
            ("MULTI_NODE_MULTI_WRITER block", caps(vec![block(Mode::MultiNodeMultiWriter)]), &["MULTI_NODE_MULTI_WRITER", "ReadWriteMany", "ReadWriteOncePod"]),
            // "If ANY of the specified volume capabilities are not supported ... MUST" fail.
            ("one supported and one MULTI_NODE capability", caps(vec![mount_cap("ext4"), mount(Mode::MultiNodeMultiWriter, "ext4", &[])]), &["MULTI_NODE_MULTI_WRITER"]),
            ("fs_type btrfs", caps(vec![mount_cap("btrfs")]), &["btrfs", "ext4 or xfs"]),
            ("block and mount access at once", caps(vec![block_cap(), mount_cap("ext4")]), &["block and mount"]),
            ("two different filesystems", caps(vec![mount_cap("ext4"), mount_cap("xfs")]), &["ext4", "xfs"]),
            (
                "a snapshot content source with an empty id",
                src(csi::volume_content_source::Type::Snapshot(csi::volume_content_source::SnapshotSource { snapshot_id: String::new() })),
                &["volume_content_source.snapshot.snapshot_id is required"],
            ),
            ("a content source naming nothing", with(&|q| q.volume_content_source = Some(csi::VolumeContentSource { r#type: None })), &["neither a snapshot nor a volume"]),
            (
                "a volume content source with an empty id",
                src(csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource { volume_id: String::new() })),
                &["volume_content_source.volume.volume_id"],
            ),
            ("negative required_bytes", range(-1, 0), &["required_bytes -1"]),
            ("negative limit_bytes", range(0, -1), &["limit_bytes -1"]),
            // A malformed range (an invalid field value), not one the plugin cannot serve.
            ("limit_bytes below required_bytes", range(64 * MIB_I, 32 * MIB_I), &["limit_bytes 33554432", "required_bytes 67108864"]),
            ("unknown parameter", params(&[("meda", "ssd")]), &["meda", "media"]),
            ("media=tape", params(&[("media", "tape")]), &["tape", "hdd, ssd, nvme"]),
            ("layout=stripe", params(&[("layout", "stripe")]), &["stripe", "partition or drive"]),
            ("mutable_parameters (no MODIFY_VOLUME)", with(&|q| q.mutable_parameters = kv(&[("media", "ssd")])), &["media", "StorageClass"]),
            ("a name of 129 bytes", named("n".repeat(129)), &["129 bytes", "128"]),
            ("a name with U+0001", named("conf-c-\u{1}".into()), &["control characters"]),
            ("a name with U+007F", named("conf-c-\u{7f}".into()), &["control characters"]),
            ("a name with U+0085", named("conf-c-\u{85}".into()), &["control characters"]),
        ];
        for (what, q, words) in invalid {
            r.code_naming(&format!("CreateVolume with {what}"), c.ctrl.create_volume(q).await, Code::InvalidArgument, words);
            r.unchanged(&format!("CreateVolume with {what}"), &fx, &clean);
        }

        // --- A clone of a volume this node does not hold (CLONE_VOLUME): NOT_FOUND.
        let q = src(csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource { volume_id: UNKNOWN_ID.into() }));
        r.code("CreateVolume cloning an unknown volume", c.ctrl.create_volume(q).await, Code::NotFound);
        r.unchanged("CreateVolume cloning an unknown volume", &fx, &clean);
    });
}

#[test]
fn create_volume_with_a_requisite_topology_without_this_node_is_resource_exhausted() {
    conform(&[GIB, 2 * GIB], async |fx, c, r| {
        let clean = fx.state();
        let good = || vol_req("conf-c-bad", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[]);
        let with = |f: &dyn Fn(&mut csi::CreateVolumeRequest)| {
            let mut q = good();
            f(&mut q);
            q
        };
        // --- Requisite topology without this node: RESOURCE_EXHAUSTED.
        for (what, req) in [
            ("another node", vec![topo(&[(NODE_KEY, "other-node")])]),
            ("another zone", vec![topo(&[(ZONE_KEY, "zone-b")])]),
            ("this node in another zone", vec![topo(&[(NODE_KEY, NODE), (ZONE_KEY, "zone-b")])]),
            ("two other nodes", vec![topo(&[(NODE_KEY, "n1")]), topo(&[(NODE_KEY, "n2")])]),
        ] {
            let q = with(&|q| q.accessibility_requirements = Some(csi::TopologyRequirement { requisite: req.clone(), preferred: vec![] }));
            r.code(&format!("CreateVolume requisite {what}"), c.ctrl.create_volume(q).await, Code::ResourceExhausted);
            r.unchanged(&format!("CreateVolume requisite {what}"), &fx, &clean);
        }
    });
}

#[test]
fn create_volume_with_a_range_no_drive_can_ever_meet_is_out_of_range() {
    conform(&[GIB, 2 * GIB], async |fx, c, r| {
        let clean = fx.state();
        let good = || vol_req("conf-c-bad", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[]);
        let with = |f: &dyn Fn(&mut csi::CreateVolumeRequest)| {
            let mut q = good();
            f(&mut q);
            q
        };
        let range = |req: i64, lim: i64| with(&move |q| q.capacity_range = Some(csi::CapacityRange { required_bytes: req, limit_bytes: lim }));
        // --- A capacity range no drive can ever meet: OUT_OF_RANGE.
        for (what, q) in [
            ("3 GiB, more than the largest drive", range(3 * GIB_I, 0)),
            ("i64::MAX bytes", range(i64::MAX, 0)),
            ("exactly 64 MiB + 1 byte (1 MiB alignment)", range(64 * MIB_I + 1, 64 * MIB_I + 1)),
            ("xfs within 64 MiB (xfs needs 300 MiB)", with(&|q| {
                q.capacity_range = Some(csi::CapacityRange { required_bytes: 0, limit_bytes: 64 * MIB_I });
                q.volume_capabilities = vec![mount_cap("xfs")];
            })),
            ("a whole drive within 100 MiB", with(&|q| {
                q.capacity_range = Some(csi::CapacityRange { required_bytes: 0, limit_bytes: 100 * MIB_I });
                q.parameters = kv(&[("layout", "drive")]);
            })),
        ] {
            r.code(&format!("CreateVolume {what}"), c.ctrl.create_volume(q).await, Code::OutOfRange);
            r.unchanged(&format!("CreateVolume {what}"), &fx, &clean);
        }
    });
}

#[test]
fn create_volume_answers_a_volume_on_one_new_partition_and_a_repeat_answers_the_same() {
    conform(&[GIB, 2 * GIB], async |fx, c, r| {
        // --- Valid creates: response fields, the partition behind them, idempotency.
        let mut ids = Vec::new();
        let long_a = format!("conf-c-long-{}", "a".repeat(116));
        let long_b = format!("conf-c-long-{}b", "a".repeat(115));
        assert_eq!((long_a.len(), long_b.len()), (128, 128));
        let valid: Vec<(&str, csi::CreateVolumeRequest, i64, i64)> = vec![
            ("an unaligned required_bytes", vol_req("conf-c-a", 64 * MIB_I + 1, 0, vec![mount_cap("ext4")], &[]), 64 * MIB_I + 1, 0),
            ("required = limit", vol_req("conf-c-exact", 32 * MIB_I, 32 * MIB_I, vec![mount_cap("ext4"), mount_cap("")], &[]), 32 * MIB_I, 32 * MIB_I),
            ("only limit_bytes", vol_req("conf-c-limit", 0, 40 * MIB_I, vec![block_cap()], &[]), 0, 40 * MIB_I),
            ("a range", vol_req("conf-c-range", 20 * MIB_I + 1, 30 * MIB_I, vec![block(Mode::SingleNodeMultiWriter)], &[]), 20 * MIB_I + 1, 30 * MIB_I),
            (
                "no capacity_range",
                csi::CreateVolumeRequest { capacity_range: None, ..vol_req("conf-c-default", 0, 0, vec![mount_cap("")], &[]) },
                0,
                0,
            ),
            ("all single-node modes", vol_req("conf-c-modes", 16 * MIB_I, 0, vec![
                mount(Mode::SingleNodeWriter, "ext4", &[]),
                mount(Mode::SingleNodeReaderOnly, "ext4", &[]),
                mount(Mode::SingleNodeSingleWriter, "ext4", &[]),
                mount(Mode::SingleNodeMultiWriter, "ext4", &["noatime"]),
            ], &[("media", "any"), ("layout", "partition"), ("csi.storage.k8s.io/pvc/name", "data")]), 16 * MIB_I, 0),
            ("a 128-byte name (csi-sanity maxlen)", vol_req(&long_a, 16 * MIB_I, 0, vec![block_cap()], &[]), 16 * MIB_I, 0),
            ("a second 128-byte name with the same 127-byte prefix", vol_req(&long_b, 16 * MIB_I, 0, vec![block_cap()], &[]), 16 * MIB_I, 0),
            ("a non-ASCII name", vol_req("conf-c-名前-ü", 16 * MIB_I, 0, vec![block_cap()], &[]), 16 * MIB_I, 0),
            // Only U+0000-U+0008, U+000B, U+000C, U+000E-U+001F, U+007F-U+009F are banned.
            ("a name with tab and newline", vol_req("conf-c-tab\there\nand", 16 * MIB_I, 0, vec![block_cap()], &[]), 16 * MIB_I, 0),
        ];
        for (what, q, req, lim) in valid {
            let what = format!("CreateVolume with {what}");
            let before = fx.state();
            let first = r.ok(&what, c.ctrl.create_volume(q.clone()).await);
            let Some(v) = created(r, &what, first, req, lim) else { continue };
            let after = fx.state();
            match fx.new_partition(&before, &after) {
                Some((_, _, size)) => {
                    r.check(size as i64 == v.capacity_bytes, || format!("{what}: capacity {} but partition {size} bytes", v.capacity_bytes));
                }
                None => r.fail(format!("{what}: want exactly one new kernel partition: {before:?} -> {after:?}")),
            }
            r.check(after.mounts == before.mounts, || format!("{what}: CreateVolume mounted something"));
            // The same call again: OK, the same volume, nothing new [CreateVolume MUST be idempotent].
            let again = r.ok(&format!("{what}, repeated"), c.ctrl.create_volume(q).await).and_then(|x| x.volume);
            r.check(again.as_ref() == Some(&v), || format!("{what}: repeating returned {again:?}, first {v:?}"));
            r.unchanged(&format!("{what}, repeated"), &fx, &after);
            ids.push(v.volume_id);
        }
        let distinct: std::collections::BTreeSet<&String> = ids.iter().collect();
        r.check(distinct.len() == ids.len(), || format!("distinct names got the same volume id: {ids:?}"));
    });
}

#[test]
fn create_volume_of_an_existing_name_with_incompatible_arguments_is_already_exists() {
    conform(&[GIB, 2 * GIB], async |fx, c, r| {
        // --- The same name, incompatible: ALREADY_EXISTS, nothing changes.
        let base = vol_req("conf-c-a", 64 * MIB_I + 1, 0, vec![mount_cap("ext4")], &[]);
        must("CreateVolume conf-c-a again", c.ctrl.create_volume(base.clone()).await).volume.unwrap();
        let before = fx.state();
        let alter = |f: &dyn Fn(&mut csi::CreateVolumeRequest)| {
            let mut q = base.clone();
            f(&mut q);
            q
        };
        for (what, q) in [
            ("a larger required_bytes", alter(&|q| q.capacity_range = Some(csi::CapacityRange { required_bytes: 128 * MIB_I, limit_bytes: 0 }))),
            ("a limit_bytes below its size", alter(&|q| q.capacity_range = Some(csi::CapacityRange { required_bytes: 0, limit_bytes: 32 * MIB_I }))),
            ("block access", alter(&|q| q.volume_capabilities = vec![block_cap()])),
            ("xfs", alter(&|q| q.volume_capabilities = vec![mount_cap("xfs")])),
            ("layout=drive", alter(&|q| q.parameters = kv(&[("layout", "drive")]))),
            ("media=ssd", alter(&|q| q.parameters = kv(&[("media", "ssd")]))),
        ] {
            r.code(&format!("CreateVolume of an existing name with {what}"), c.ctrl.create_volume(q).await, Code::AlreadyExists);
            r.unchanged(&format!("CreateVolume of an existing name with {what}"), &fx, &before);
        }
        // Both the ALREADY_EXISTS row (incompatible accessibility_requirements) and the
        // RESOURCE_EXHAUSTED row (cannot provision in the topology) fit; csi-sanity has
        // no case, so either is accepted.
        let q = alter(&|q| {
            q.accessibility_requirements = Some(csi::TopologyRequirement { requisite: vec![topo(&[(NODE_KEY, "other-node")])], preferred: vec![] })
        });
        r.code_any(
            "CreateVolume of an existing name with a requisite topology without this node",
            c.ctrl.create_volume(q).await,
            &[Code::AlreadyExists, Code::ResourceExhausted],
        );
        r.unchanged("CreateVolume of an existing name with a requisite topology without this node", &fx, &before);
    });
}

#[test]
fn create_volume_of_an_existing_name_with_compatible_arguments_is_the_same_volume() {
    conform(&[GIB, 2 * GIB], async |fx, c, r| {
        // --- The same name, incompatible: ALREADY_EXISTS, nothing changes.
        let base = vol_req("conf-c-a", 64 * MIB_I + 1, 0, vec![mount_cap("ext4")], &[]);
        let existing = must("CreateVolume conf-c-a again", c.ctrl.create_volume(base.clone()).await).volume.unwrap();
        let before = fx.state();
        let alter = |f: &dyn Fn(&mut csi::CreateVolumeRequest)| {
            let mut q = base.clone();
            f(&mut q);
            q
        };
        // ... and compatible: OK with the same volume.
        for (what, q) in [
            ("secrets", alter(&|q| q.secrets = kv(&[("password", "hunter2")]))),
            ("a Kubernetes parameter", alter(&|q| q.parameters = kv(&[("csi.storage.k8s.io/pvc/name", "data")]))),
            ("SINGLE_NODE_MULTI_WRITER", alter(&|q| q.volume_capabilities = vec![mount(Mode::SingleNodeMultiWriter, "ext4", &[])])),
            ("the default filesystem", alter(&|q| q.volume_capabilities = vec![mount_cap("")])),
            ("its exact size as the range", alter(&|q| {
                q.capacity_range = Some(csi::CapacityRange { required_bytes: existing.capacity_bytes, limit_bytes: existing.capacity_bytes })
            })),
            ("no capacity_range", alter(&|q| q.capacity_range = None)),
            ("a requisite topology with this node", alter(&|q| {
                q.accessibility_requirements = Some(csi::TopologyRequirement { requisite: vec![topo(&[(NODE_KEY, NODE)])], preferred: vec![] })
            })),
        ] {
            let what = format!("CreateVolume of an existing name with {what}");
            let v = r.ok(&what, c.ctrl.create_volume(q).await).and_then(|x| x.volume);
            r.check(v.as_ref() == Some(&existing), || format!("{what}: got {v:?}, want the existing {existing:?}"));
            r.unchanged(&what, &fx, &before);
        }
    });
}

#[test]
fn validate_volume_capabilities_confirms_exactly_what_the_volume_serves() {
    conform(&[GIB, 2 * GIB], async |fx, c, r| {
        let base = vol_req("conf-c-a", 64 * MIB_I + 1, 0, vec![mount_cap("ext4")], &[]);
        let existing = must("CreateVolume conf-c-a again", c.ctrl.create_volume(base.clone()).await).volume.unwrap();
        // --- ValidateVolumeCapabilities.
        let blk = must("CreateVolume block", c.ctrl.create_volume(vol_req("conf-c-blk", 16 * MIB_I, 0, vec![block_cap()], &[])).await).volume.unwrap();
        let before = fx.state();
        r.code("ValidateVolumeCapabilities without volume_id", c.ctrl.validate_volume_capabilities(validate_req("", vec![mount_cap("ext4")])).await, Code::InvalidArgument);
        r.code(
            "ValidateVolumeCapabilities without capabilities",
            c.ctrl.validate_volume_capabilities(validate_req(&existing.volume_id, vec![])).await,
            Code::InvalidArgument,
        );
        r.code("ValidateVolumeCapabilities of an unknown volume", c.ctrl.validate_volume_capabilities(validate_req(UNKNOWN_ID, vec![mount_cap("ext4")])).await, Code::NotFound);
        for (what, id, caps) in [
            ("ext4 SINGLE_NODE_WRITER", &existing.volume_id, vec![mount_cap("ext4")]),
            ("the default fs, two single-node modes", &existing.volume_id, vec![mount(Mode::SingleNodeMultiWriter, "", &[]), mount(Mode::SingleNodeReaderOnly, "", &[])]),
            ("block SINGLE_NODE_SINGLE_WRITER", &blk.volume_id, vec![block(Mode::SingleNodeSingleWriter)]),
        ] {
            let q = validate_req(id, caps.clone());
            let got = r.ok(&format!("ValidateVolumeCapabilities {what}"), c.ctrl.validate_volume_capabilities(q.clone()).await);
            if let Some(got) = got {
                let confirmed = got.confirmed.as_ref().map(|c| c.volume_capabilities.clone());
                r.check(confirmed.as_ref() == Some(&caps), || format!("ValidateVolumeCapabilities {what}: want {caps:?} confirmed, got {got:?}"));
                let again = r.ok(&format!("ValidateVolumeCapabilities {what}, repeated"), c.ctrl.validate_volume_capabilities(q).await);
                r.check(again.as_ref() == Some(&got), || format!("ValidateVolumeCapabilities {what}: repeat answered {again:?}, first {got:?}"));
            }
        }
        for (what, id, caps, params) in [
            ("MULTI_NODE_MULTI_WRITER", &existing.volume_id, vec![mount(Mode::MultiNodeMultiWriter, "ext4", &[])], vec![]),
            ("one good and one MULTI_NODE capability", &existing.volume_id, vec![mount_cap("ext4"), mount(Mode::MultiNodeReaderOnly, "ext4", &[])], vec![]),
            ("btrfs", &existing.volume_id, vec![mount_cap("btrfs")], vec![]),
            ("xfs on an ext4 volume", &existing.volume_id, vec![mount_cap("xfs")], vec![]),
            ("block on a mount volume", &existing.volume_id, vec![block_cap()], vec![]),
            ("mount on a block volume", &blk.volume_id, vec![mount_cap("")], vec![]),
            ("layout=drive on a partition volume", &existing.volume_id, vec![mount_cap("ext4")], vec![("layout", "drive")]),
        ] {
            let q = csi::ValidateVolumeCapabilitiesRequest { parameters: kv(&params), ..validate_req(id, caps) };
            if let Some(got) = r.ok(&format!("ValidateVolumeCapabilities {what}"), c.ctrl.validate_volume_capabilities(q).await) {
                r.check(got.confirmed.is_none(), || format!("ValidateVolumeCapabilities {what}: confirmed {:?}", got.confirmed));
                r.check(!got.message.is_empty(), || format!("ValidateVolumeCapabilities {what}: unconfirmed without a message"));
            }
        }
        r.unchanged("ValidateVolumeCapabilities", &fx, &before);
    });
}

#[test]
fn delete_volume_is_idempotent_and_gives_the_space_back() {
    conform(&[GIB, 2 * GIB], async |fx, c, r| {
        let clean = fx.state();
        let all = must("GetCapacity", c.ctrl.get_capacity(csi::GetCapacityRequest::default()).await);
        let base = vol_req("conf-c-a", 64 * MIB_I + 1, 0, vec![mount_cap("ext4")], &[]);
        let existing = must("CreateVolume conf-c-a again", c.ctrl.create_volume(base.clone()).await).volume.unwrap();
        let blk = must("CreateVolume block", c.ctrl.create_volume(vol_req("conf-c-blk", 16 * MIB_I, 0, vec![block_cap()], &[])).await).volume.unwrap();
        let ids = vec![existing.volume_id.clone(), blk.volume_id.clone()];
        let before = fx.state();
        // --- DeleteVolume.
        r.code("DeleteVolume without volume_id", c.ctrl.delete_volume(del_req("")).await, Code::InvalidArgument);
        for id in [UNKNOWN_ID, "not-a-volume-id"] {
            // csi-sanity: "should succeed when an invalid volume id is used".
            r.ok(&format!("DeleteVolume of unknown {id}"), c.ctrl.delete_volume(del_req(id)).await);
            r.ok(&format!("DeleteVolume of unknown {id}, repeated"), c.ctrl.delete_volume(del_req(id)).await);
        }
        r.unchanged("DeleteVolume of unknown volumes", &fx, &before);
        for id in &ids {
            r.ok("DeleteVolume", c.ctrl.delete_volume(del_req(id)).await);
            r.ok("DeleteVolume, repeated", c.ctrl.delete_volume(del_req(id)).await);
        }
        r.unchanged("every volume deleted", &fx, &clean);
        r.code(
            "ValidateVolumeCapabilities of a deleted volume",
            c.ctrl.validate_volume_capabilities(validate_req(&existing.volume_id, vec![mount_cap("ext4")])).await,
            Code::NotFound,
        );
        let (back, settled) = capacity_settles(c, csi::GetCapacityRequest::default(), |g| g.available_capacity == all.available_capacity).await;
        r.check(settled, || format!("available_capacity {} 10 s after deleting everything, was {}", back.available_capacity, all.available_capacity));
    });
}

#[test]
fn create_volume_without_room_now_is_resource_exhausted_and_beyond_any_drive_out_of_range() {
    conform(&[GIB, 2 * GIB], async |fx, c, r| {
        let (small, large) = (usable(GIB), usable(2 * GIB));
        let clean = fx.state();
        // --- No room now (but a drive could hold it): RESOURCE_EXHAUSTED.
        let fill_a = must("CreateVolume filling the small drive", c.ctrl.create_volume(vol_req("conf-c-fill-a", small - 22 * MIB_I, 0, vec![block_cap()], &[])).await);
        let fill_b = must("CreateVolume filling the large drive", c.ctrl.create_volume(vol_req("conf-c-fill-b", large - 46 * MIB_I, 0, vec![block_cap()], &[])).await);
        let full = fx.state();
        let (g, settled) = capacity_settles(c, csi::GetCapacityRequest::default(), |g| g.available_capacity == 68 * MIB_I).await;
        r.check(settled, || format!("available_capacity {} 10 s after filling the drives to 22 + 46 MiB", g.available_capacity));
        r.check(g.maximum_volume_size == Some(46 * MIB_I), || format!("maximum_volume_size {:?} with 22 and 46 MiB free", g.maximum_volume_size));
        for (what, q, want) in [
            ("100 MiB with 22 and 46 MiB left", vol_req("conf-c-nr1", 100 * MIB_I, 0, vec![block_cap()], &[]), Code::ResourceExhausted),
            ("the large drive's size, taken", vol_req("conf-c-nr2", large, 0, vec![block_cap()], &[]), Code::ResourceExhausted),
            ("a whole drive, none empty", vol_req("conf-c-nr3", 0, 0, vec![block_cap()], &[("layout", "drive")]), Code::ResourceExhausted),
            ("3 GiB, still more than any drive", vol_req("conf-c-nr4", 3 * GIB_I, 0, vec![block_cap()], &[]), Code::OutOfRange),
        ] {
            r.code(&format!("CreateVolume {what}"), c.ctrl.create_volume(q).await, want);
            r.unchanged(&format!("CreateVolume {what}"), &fx, &full);
        }
        for v in [fill_a, fill_b] {
            must("DeleteVolume", c.ctrl.delete_volume(del_req(&v.volume.unwrap().volume_id)).await);
        }
        r.unchanged("the end", &fx, &clean);
    });
}

/// GetCapacity of drivelet's drives, field by field: blank managed drives count, a drive
/// holding a filesystem does not; a topology, media or capability drivelet cannot serve
/// gets 0; bad parameters are INVALID_ARGUMENT.
#[test]
fn get_capacity_counts_blank_managed_drives_field_by_field_and_zero_for_what_cannot_be_served() {
    require_host();
    let tmp = short_tempdir();
    let _a = LoopDrive::new(tmp.path(), "a.img", GIB);
    let _b = LoopDrive::new(tmp.path(), "b.img", 2 * GIB);
    let with_fs = LoopDrive::new(tmp.path(), "c.img", GIB);
    sh("mkfs.ext4", &["-q", "-F", with_fs.dev.to_str().unwrap()]);
    sh("udevadm", &["settle"]);
    let agent = Agent::start(tmp.path(), AgentOpts::default());
    rt().block_on(async {
        let c = Csi::connect(&agent).await;
        let ctrl = c.ctrl.clone();
        // Two blank drives: 1022 MiB + 2046 MiB usable; the ext4 drive counts for nothing.
        let get = |req: csi::GetCapacityRequest| {
            let mut c = ctrl.clone();
            async move { c.get_capacity(req).await }
        };
        let all = get(csi::GetCapacityRequest::default()).await.unwrap().into_inner();
        assert_eq!(all.available_capacity, 3068 * MIB_I);
        assert_eq!(all.maximum_volume_size, Some(2046 * MIB_I));
        assert_eq!(all.minimum_volume_size, Some(MIB_I), "no capability: a block volume's minimum");

        let ours = get(csi::GetCapacityRequest {
            accessible_topology: Some(topo(&[("topology.drivelet.io/node", NODE)])),
            parameters: kv(&[("media", "virtual"), ("csi.storage.k8s.io/fstype", "ext4")]),
            volume_capabilities: vec![mount(Mode::SingleNodeWriter, "", &[])],
        })
        .await
        .unwrap()
        .into_inner();
        assert_eq!(ours.available_capacity, 3068 * MIB_I);

        let whole = get(csi::GetCapacityRequest { parameters: kv(&[("layout", "drive")]), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!((whole.available_capacity, whole.maximum_volume_size), (3068 * MIB_I, Some(2046 * MIB_I)));

        for (why, req) in [
            ("other node", csi::GetCapacityRequest { accessible_topology: Some(topo(&[("topology.drivelet.io/node", "elsewhere")])), ..Default::default() }),
            ("other zone", csi::GetCapacityRequest { accessible_topology: Some(topo(&[("topology.kubernetes.io/zone", "zone-b")])), ..Default::default() }),
            ("unknown key", csi::GetCapacityRequest { accessible_topology: Some(topo(&[("rack", "r1")])), ..Default::default() }),
            ("no ssd", csi::GetCapacityRequest { parameters: kv(&[("media", "ssd")]), ..Default::default() }),
            ("multi-node", csi::GetCapacityRequest {
                volume_capabilities: vec![mount(Mode::MultiNodeMultiWriter, "", &[])],
                ..Default::default()
            }),
        ] {
            let r = get(req).await.unwrap().into_inner();
            assert_eq!(r.available_capacity, 0, "{why}");
            assert_eq!(r.maximum_volume_size, Some(0), "{why}");
        }

        for (why, req) in [
            ("unknown parameter", csi::GetCapacityRequest { parameters: kv(&[("meda", "ssd")]), ..Default::default() }),
            ("bad media", csi::GetCapacityRequest { parameters: kv(&[("media", "tape")]), ..Default::default() }),
            ("no access mode", csi::GetCapacityRequest {
                volume_capabilities: vec![csi::VolumeCapability { access_mode: None, access_type: None }],
                ..Default::default()
            }),
        ] {
            let e = get(req).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{why}: {e:?}");
            assert!(!e.message().is_empty());
        }
    });
}

// ---------------------------------------------------------------------------------
// Topology requirements and whole-drive volumes.
// ---------------------------------------------------------------------------------

#[test]
fn create_volume_with_requisite_or_preferred_topology_naming_this_node_is_placed_here() {
    conform(&[GIB, 2 * GIB], async |fx, c, r| {
        let (small, large) = (usable(GIB), usable(2 * GIB));
        let clean = fx.state();
        let this = topo(&[(NODE_KEY, NODE)]);
        let other = topo(&[(NODE_KEY, "other-node")]);
        let zone = topo(&[(ZONE_KEY, "zone-a")]);
        let full = topo(&[(NODE_KEY, NODE), (ZONE_KEY, "zone-a")]);
        let req = |requisite: Vec<csi::Topology>, preferred: Vec<csi::Topology>| csi::TopologyRequirement { requisite, preferred };

        // --- Requisite lists that include this node, and preferred in any order: OK.
        for (i, (what, t)) in [
            ("requisite: another node, then this one", req(vec![other.clone(), this.clone()], vec![])),
            ("requisite: this node's zone only", req(vec![zone.clone()], vec![])),
            ("requisite: this node's full topology", req(vec![full.clone()], vec![])),
            ("preferred: another node first, both requisite", req(vec![other.clone(), this.clone()], vec![other.clone(), this.clone()])),
            ("preferred: this node first, both requisite", req(vec![this.clone(), other.clone()], vec![this.clone(), other.clone()])),
            ("preferred only, naming another node", req(vec![], vec![other.clone()])),
        ]
        .into_iter()
        .enumerate()
        {
            let q = csi::CreateVolumeRequest {
                accessibility_requirements: Some(t.clone()),
                ..vol_req(&format!("conf-t-ok-{i}"), 16 * MIB_I, 0, vec![block_cap()], &[])
            };
            let what = format!("CreateVolume with {what}");
            let got = r.ok(&what, c.ctrl.create_volume(q.clone()).await);
            let Some(v) = created(r, &what, got, 16 * MIB_I, 0) else { continue };
            // Accessible from at least one requisite topology [TopologyRequirement].
            if !t.requisite.is_empty() {
                let satisfied = t.requisite.iter().any(|want| {
                    v.accessible_topology.iter().any(|got| want.segments.iter().all(|(k, val)| got.segments.get(k) == Some(val)))
                });
                r.check(satisfied, || format!("{what}: accessible_topology {:?} meets none of {:?}", v.accessible_topology, t.requisite));
            }
            let again = r.ok(&format!("{what}, repeated"), c.ctrl.create_volume(q).await).and_then(|x| x.volume);
            r.check(again.as_ref() == Some(&v), || format!("{what}: repeat gave {again:?}, first {v:?}"));
            must("DeleteVolume", c.ctrl.delete_volume(del_req(&v.volume_id)).await);
        }
        r.unchanged("topology cases", &fx, &clean);
        let (now, settled) = capacity_settles(c, layout_req("drive"), |g| g.available_capacity == small + large).await;
        r.check(settled, || format!("layout=drive available_capacity {} 10 s after the topology volumes were deleted", now.available_capacity));
    });
}

#[test]
fn whole_drive_volumes_take_one_empty_drive_each_and_refuse_when_none_is_empty() {
    conform(&[GIB, 2 * GIB], async |fx, c, r| {
        let (small, large) = (usable(GIB), usable(2 * GIB));
        let clean = fx.state();
        // --- Whole drives: each layout=drive volume takes one empty drive entirely.
        let whole = |name: &str, required: i64, limit: i64| vol_req(name, required, limit, vec![block_cap()], &[("layout", "drive")]);
        let g = must("GetCapacity layout=drive", c.ctrl.get_capacity(layout_req("drive")).await);
        r.check(g.maximum_volume_size == Some(large), || format!("layout=drive maximum_volume_size {:?}, want the larger drive {large}", g.maximum_volume_size));
        // (drive index, volume id) of each whole-drive volume.
        let mut wholes: Vec<(Option<usize>, String)> = Vec::new();
        for name in ["conf-t-whole-1", "conf-t-whole-2"] {
            let before = fx.state();
            let got = r.ok(&format!("CreateVolume {name} layout=drive"), c.ctrl.create_volume(whole(name, 0, 0)).await);
            let Some(v) = created(r, name, got, 0, 0) else { continue };
            let after = fx.state();
            let drive = fx.new_partition(&before, &after).map(|(drive, _, size)| {
                let want = if fx.drives[drive].file.ends_with("d0.img") { small } else { large };
                r.check(after.parts[drive].len() == 1 && size as i64 == want && v.capacity_bytes == want, || {
                    format!("{name}: want the whole of drive {drive} ({want} bytes) as its only partition, got {:?} and capacity {}", after.parts[drive], v.capacity_bytes)
                });
                r.check(!wholes.iter().any(|w| w.0 == Some(drive)), || format!("{name}: placed on drive {drive}, already taken whole"));
                drive
            });
            r.check(drive.is_some(), || format!("{name}: want one new partition: {before:?} -> {after:?}"));
            let again = r.ok(&format!("CreateVolume {name} layout=drive, repeated"), c.ctrl.create_volume(whole(name, 0, 0)).await).and_then(|x| x.volume);
            r.check(again.as_ref() == Some(&v), || format!("{name}: repeat gave {again:?}, first {v:?}"));
            wholes.push((drive, v.volume_id));
        }
        let both = fx.state();
        for (what, q, want) in [
            ("a third layout=drive volume", whole("conf-t-whole-3", 0, 0), Code::ResourceExhausted),
            ("a partition volume with every drive taken whole", vol_req("conf-t-part", 16 * MIB_I, 0, vec![block_cap()], &[]), Code::ResourceExhausted),
            ("a 3 GiB layout=drive volume", whole("conf-t-huge", 3 * GIB_I, 0), Code::OutOfRange),
        ] {
            r.code(&format!("CreateVolume {what}"), c.ctrl.create_volume(q).await, want);
            r.unchanged(&format!("CreateVolume {what}"), &fx, &both);
        }
        let (none, settled) = capacity_settles(c, layout_req("drive"), |g| g.available_capacity == 0).await;
        r.check(settled, || format!("layout=drive available_capacity {} 10 s after every drive was taken", none.available_capacity));

        // Free the small drive; a partition volume there makes it no longer empty.
        let small_idx = fx.drives.iter().position(|d| d.file.ends_with("d0.img")).unwrap();
        if let Some(i) = wholes.iter().position(|w| w.0 == Some(small_idx)) {
            must("DeleteVolume", c.ctrl.delete_volume(del_req(&wholes.remove(i).1)).await);
            // (Reusing freed space at once is checked on its own below.)
            capacity_settles(c, layout_req("drive"), |g| g.available_capacity == small).await;
            let before = fx.state();
            r.code("CreateVolume layout=drive within 100 MiB", c.ctrl.create_volume(whole("conf-t-limited", 0, 100 * MIB_I)).await, Code::OutOfRange);
            r.unchanged("CreateVolume layout=drive within 100 MiB", &fx, &before);
            let part = must("CreateVolume partition", c.ctrl.create_volume(vol_req("conf-t-part", 16 * MIB_I, 0, vec![block_cap()], &[])).await).volume.unwrap();
            let before = fx.state();
            r.code(
                "CreateVolume layout=drive when the only free drive holds a partition",
                c.ctrl.create_volume(whole("conf-t-whole-3", 0, 0)).await,
                Code::ResourceExhausted,
            );
            r.unchanged("CreateVolume layout=drive when the only free drive holds a partition", &fx, &before);
            must("DeleteVolume", c.ctrl.delete_volume(del_req(&part.volume_id)).await);
        }
        for (_, id) in wholes {
            must("DeleteVolume", c.ctrl.delete_volume(del_req(&id)).await);
        }
        r.unchanged("whole drives deleted", &fx, &clean);
        let (now, settled) = capacity_settles(c, layout_req("drive"), |g| g.available_capacity == small + large).await;
        r.check(settled, || format!("layout=drive available_capacity {} 10 s after the whole drives were freed", now.available_capacity));
    });
}

#[test]
fn space_freed_by_delete_volume_is_usable_by_the_very_next_create_volume() {
    conform(&[GIB, 2 * GIB], async |fx, c, r| {
        let (small, large) = (usable(GIB), usable(2 * GIB));
        let clean = fx.state();
        // --- Space DeleteVolume frees is usable by the very next CreateVolume: once the
        // inventory has seen a volume, deleting it must not leave a stale extent that
        // makes the next create RESOURCE_EXHAUSTED although the drive is empty. Only the
        // large drive can hold these, so nothing can fall back to the other one. The
        // window is a race with udev, so each case gets five tries; a correct driver
        // passes every one.
        for (what, params) in [("a whole drive", &[("layout", "drive")][..]), ("a partition as large as a drive", &[][..])] {
            let q = |name: &str| vol_req(name, large, 0, vec![block_cap()], params);
            let Some(first) = r.ok(&format!("CreateVolume {what}"), c.ctrl.create_volume(q("conf-t-reuse-0")).await) else { continue };
            let mut id = first.volume.expect("a volume").volume_id;
            for round in 1..=5 {
                let (_, seen) = capacity_settles(c, layout_req("partition"), |g| g.available_capacity == small).await;
                r.check(seen, || format!("{what}: GetCapacity still offers its space 10 s after CreateVolume"));
                must("DeleteVolume", c.ctrl.delete_volume(del_req(&id)).await);
                let what = format!("CreateVolume {what} right after DeleteVolume freed the drive (try {round})");
                match r.ok(&what, c.ctrl.create_volume(q(&format!("conf-t-reuse-{round}"))).await) {
                    Some(v) => id = created(r, &what, Some(v), large, 0).expect("a volume").volume_id,
                    None => {
                        id = String::new();
                        break;
                    }
                }
            }
            if !id.is_empty() {
                must("DeleteVolume", c.ctrl.delete_volume(del_req(&id)).await);
            }
            let (now, settled) = capacity_settles(c, layout_req("drive"), |g| g.available_capacity == small + large).await;
            r.check(settled, || format!("{what}: GetCapacity {now:?} 10 s after its volumes were deleted, want both drives free"));
        }
        r.unchanged("the end", &fx, &clean);
    });
}
