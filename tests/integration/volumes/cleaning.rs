//! Clean extents on real loop drives: no volume ever shows bytes its tenant did not
//! write.
//!
//! - A block volume filled with a pattern is deleted; block volumes of every size, and
//!   a whole-drive one, created over that space read back only zeros (`O_DIRECT`
//!   reads of their partitions), the first one created right after the delete (it
//!   waits for the cleaner).
//! - ext4 and xfs volumes made there hold none of the old tenant's blocks (mkfs writes
//!   only its metadata; the rest of the partition is what the drive held).
//! - A drive filled with a pattern and then `wipefs -a`'d before drivelet first saw it
//!   is zeroed whole before its first volume.
//! - While freed space is being cleaned, GetCapacity does not promise it, `ctl drives`
//!   shows it and its progress, and a create that fits only there waits for it, or is
//!   refused with RESOURCE_EXHAUSTED naming it when the wait is too short (the cleaner is
//!   slowed by the `clean.zeroed` fail point, so these need `--features failpoints`).
//!
//! The kill -9 in the middle of zeroing is tests/crash.rs's
//! (`cleaning_killed_mid_zeroing_resumes_after_restart_and_new_volumes_read_zeros`).
#![allow(clippy::assertions_on_constants)]

use std::collections::HashMap;
use std::path::Path;

use crate::common::*;
use drivelet::grpc::proto::csi;
use tonic::Code;

const DRIVE: u64 = GIB;

fn params(layout: &str) -> HashMap<String, String> {
    HashMap::from([("layout".to_string(), layout.to_string())])
}

async fn create(c: &mut Csi, name: &str, bytes: u64, layout: &str) -> Result<(String, u64), tonic::Status> {
    let mut req = create_req(name, bytes, block_cap());
    req.parameters = params(layout);
    c.ctrl.create_volume(req).await.map(|r| {
        let v = r.into_inner().volume.unwrap_or_default();
        (v.volume_id, v.capacity_bytes as u64)
    })
}

async fn delete(c: &mut Csi, id: &str) {
    c.ctrl
        .delete_volume(csi::DeleteVolumeRequest { volume_id: id.to_string(), ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("DeleteVolume {id}: {e}"));
}

async fn capacity(c: &mut Csi, layout: &str) -> (u64, u64) {
    let r = c
        .ctrl
        .get_capacity(csi::GetCapacityRequest { parameters: params(layout), volume_capabilities: vec![block_cap()], ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    (r.available_capacity as u64, r.maximum_volume_size.unwrap_or(0) as u64)
}

/// The usable region of the test drive.
fn region() -> (u64, u64) {
    drivelet::disk::gpt::usable_region(DRIVE, 512).unwrap()
}

/// Fills the drive's whole usable region through one block volume, deletes it, and
/// answers once the delete returned (the cleaning runs on).
async fn tenant_fills_and_leaves(c: &mut Csi, agent: &Agent, drive: &LoopDrive, name: &str) {
    let (lo, hi) = region();
    let (id, size) = create(c, name, hi - lo, "partition").await.unwrap_or_else(|e| panic!("create {name}: {e}; log:\n{}", agent.log_tail(30)));
    assert_eq!(size, hi - lo);
    let dev = volume_dev(drive, &id);
    fill(&dev, 0, size, PATTERN);
    assert_eq!(first_nonzero(&dev, size / 2, size / 2 + 4096), Some((size / 2, PATTERN)), "the pattern is on the volume");
    delete(c, &id).await;
}

#[test]
fn volumes_of_every_size_and_layout_made_where_a_deleted_volume_lived_read_only_zeros() {
    require_host();
    let tmp = short_tempdir();
    let drive = LoopDrive::new(tmp.path(), "a.img", DRIVE);
    sh("udevadm", &["settle"]);
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    wait_clean(&agent, &drive);
    let (lo, hi) = region();
    let rt = rt();
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        tenant_fills_and_leaves(&mut c, &agent, &drive, "old-tenant").await;
        // Right after the delete: the create waits for the cleaner, never gets old bytes.
        let mut made = Vec::new();
        let mut left = hi - lo;
        for (i, size) in [MIB, 16 * MIB, 100 * MIB, 301 * MIB].into_iter().enumerate() {
            let (id, got) = create(&mut c, &format!("new-{i}"), size, "partition").await.unwrap_or_else(|e| panic!("create {size}: {e}; log:\n{}", agent.log_tail(30)));
            assert_zeros(&drive, &id, &format!("a new {size}-byte volume"));
            left -= got;
            made.push(id);
        }
        let (id, _) = create(&mut c, "new-rest", left, "partition").await.unwrap_or_else(|e| panic!("create the rest ({left}): {e}"));
        assert_zeros(&drive, &id, "a volume over the rest of the drive");
        made.push(id);
        assert_eq!(capacity(&mut c, "partition").await, (0, 0), "the drive is full");

        // Each new tenant writes all of its volume, then they all leave; a whole-drive
        // volume made next reads zeros too.
        for id in &made {
            let dev = volume_dev(&drive, id);
            fill(&dev, 0, dev_size(&dev), PATTERN);
        }
        for id in &made {
            delete(&mut c, id).await;
        }
        let (id, got) = create(&mut c, "whole", MIB, "drive").await.unwrap_or_else(|e| panic!("create a whole-drive volume: {e}; log:\n{}", agent.log_tail(30)));
        assert_eq!(got, hi - lo);
        assert_zeros(&drive, &id, "a whole-drive volume after five tenants");
        delete(&mut c, &id).await;
    });
    wait_clean(&agent, &drive);
    assert_eq!(first_nonzero(&drive.dev, lo, hi), None, "the drive's free space is all zero once cleaned");
    assert!(gpt_entries(&drive.dev).is_empty(), "no partition is left, cleaning needs none");
    assert_eq!(agent.stop(), 0, "clean exit; log:\n{}", agent.log_tail(40));
}

#[test]
fn a_drive_filled_with_a_pattern_and_wiped_before_drivelet_saw_it_is_zeroed_whole_before_its_first_volume() {
    require_host();
    let tmp = short_tempdir();
    let drive = LoopDrive::new(tmp.path(), "a.img", DRIVE);
    fill(&drive.dev, 0, DRIVE, PATTERN);
    sh("mkfs.ext4", &["-q", "-F", drive.dev.to_str().unwrap()]);
    sh("wipefs", &["-a", "-q", drive.dev.to_str().unwrap()]);
    sh("udevadm", &["trigger", "--action=change", "--settle", drive.dev.to_str().unwrap()]);
    let (lo, hi) = region();
    assert!(first_nonzero(&drive.dev, lo, hi).is_some(), "the old bytes are there before drivelet sees the drive");
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    let rt = rt();
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        // The first volume, a whole-drive one, at once: it waits for the cleaner.
        let (id, got) = create(&mut c, "first", MIB, "drive").await.unwrap_or_else(|e| panic!("create: {e}; log:\n{}", agent.log_tail(30)));
        assert_eq!(got, hi - lo);
        assert_zeros(&drive, &id, "the first volume of a drive taken as blank");
        delete(&mut c, &id).await;
        for (i, size) in [MIB, 64 * MIB, 512 * MIB].into_iter().enumerate() {
            let (id, _) = create(&mut c, &format!("p-{i}"), size, "partition").await.unwrap_or_else(|e| panic!("create {size}: {e}"));
            assert_zeros(&drive, &id, &format!("a {size}-byte volume"));
        }
    });
    let d = drive_listed(&agent, &drive);
    assert_eq!(d["class"], "managed", "{d}");
    assert_eq!(agent.stop(), 0, "clean exit; log:\n{}", agent.log_tail(40));
}

#[test]
fn space_being_cleaned_is_never_promised_is_shown_and_a_create_that_needs_it_waits_or_is_told_why() {
    assert!(cfg!(feature = "failpoints"), "this test slows the cleaner with a fail point: run it with `--features failpoints`");
    require_host();
    let tmp = short_tempdir();
    let drive = LoopDrive::new(tmp.path(), "a.img", DRIVE);
    sh("udevadm", &["settle"]);
    let (lo, hi) = region();
    // Every cleaning step pauses 3 s between the zeroing and its record; a create waits
    // at most 1 s for it.
    let env = [("FAILPOINTS", "clean.zeroed=sleep(3000)"), ("DRIVELET__VOLUMES__CLEANING_WAIT", "1s")];
    let mut agent = Agent::start_with(tmp.path(), AgentOpts::default(), &env);
    wait_clean(&agent, &drive);
    let rt = rt();
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let (keep, _) = create(&mut c, "keep", 256 * MIB, "partition").await.unwrap();
        let (gone, _) = create(&mut c, "gone", 512 * MIB, "partition").await.unwrap();
        let before = capacity(&mut c, "partition").await;
        assert_eq!(before, (hi - lo - 768 * MIB, hi - lo - 768 * MIB));
        let dev = volume_dev(&drive, &gone);
        fill(&dev, 0, 512 * MIB, PATTERN);
        delete(&mut c, &gone).await;

        // While it is cleaned: not promised, shown with its progress, refused by name.
        assert_eq!(capacity(&mut c, "partition").await, before, "GetCapacity promises none of the space being cleaned");
        let d = drive_listed(&agent, &drive);
        assert_eq!(d["cleaning"]["left_bytes"], 512 * MIB, "{d}");
        assert_eq!(d["cleaning"]["round_bytes"], 512 * MIB, "{d}");
        let table = String::from_utf8_lossy(
            &std::process::Command::new(bin()).args(["ctl", "--socket", agent.admin_socket.to_str().unwrap(), "drives"]).output().unwrap().stdout,
        )
        .into_owned();
        assert!(table.contains("512.0 MiB being cleaned (0% done)"), "{table}");
        let big = before.1 + 256 * MIB;
        let e = create(&mut c, "needs-it", big, "partition").await.expect_err("the space is still being cleaned after 1 s");
        assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
        assert!(e.message().contains("being cleaned") && e.message().contains("512.0 MiB"), "the refusal names the space being cleaned: {}", e.message());

        // Once clean: promised, placed, and zero.
        wait_clean(&agent, &drive);
        assert_eq!(capacity(&mut c, "partition").await, (hi - lo - 256 * MIB, hi - lo - 256 * MIB));
        let (id, _) = create(&mut c, "needs-it", big, "partition").await.unwrap_or_else(|e| panic!("create once clean: {e}"));
        assert_zeros(&drive, &id, "a volume over space cleaned while the agent was slowed");
        delete(&mut c, &id).await;
        delete(&mut c, &keep).await;
    });
    assert_eq!(agent.stop(), 0, "clean exit; log:\n{}", agent.log_tail(40));
}

/// How many whole 4 KiB blocks of `dev` hold nothing but the old tenant's pattern.
fn pattern_blocks(dev: &Path) -> u64 {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let size = dev_size(dev);
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(dev).unwrap();
    let mut b = Aligned::new(4 * MIB as usize, 0);
    let (mut at, mut found) = (0, 0);
    while at < size {
        let n = (size - at).min(4 * MIB) as usize;
        let buf = &mut b.buf()[..n];
        f.read_exact_at(buf, at).unwrap();
        found += buf.chunks(4096).filter(|c| c.iter().all(|&x| x == PATTERN)).count() as u64;
        at += n as u64;
    }
    found
}

#[test]
fn ext4_and_xfs_volumes_made_where_a_deleted_volume_lived_hold_none_of_its_blocks() {
    require_host();
    let tmp = short_tempdir();
    let drive = LoopDrive::new(tmp.path(), "a.img", DRIVE);
    sh("udevadm", &["settle"]);
    let _unmount = Unmounter(tmp.path().to_path_buf());
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    wait_clean(&agent, &drive);
    let rt = rt();
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        tenant_fills_and_leaves(&mut c, &agent, &drive, "old-tenant").await;
        for (fs, size) in [("ext4", 400 * MIB), ("xfs", 400 * MIB)] {
            let v = c.ctrl.create_volume(create_req(&format!("fs-{fs}"), size, mount_cap(fs))).await;
            let id = v.unwrap_or_else(|e| panic!("create {fs}: {e}; log:\n{}", agent.log_tail(30))).into_inner().volume.unwrap().volume_id;
            let staging = tmp.path().join(format!("kubelet/stage-{fs}"));
            std::fs::create_dir_all(&staging).unwrap();
            c.node.node_stage_volume(stage_req(&id, &staging, mount_cap(fs))).await.unwrap_or_else(|e| panic!("stage {fs}: {e}"));
            std::fs::write(staging.join("mine"), b"the new tenant's own file").unwrap();
            let req = csi::NodeUnstageVolumeRequest { volume_id: id.clone(), staging_target_path: staging.display().to_string() };
            c.node.node_unstage_volume(req).await.unwrap_or_else(|e| panic!("unstage {fs}: {e}"));
            // mkfs writes only its metadata: everywhere else the partition is what the
            // drive held, and that must not be the old tenant's.
            let dev = volume_dev(&drive, &id);
            assert_eq!(pattern_blocks(&dev), 0, "{fs}: the new volume's partition holds blocks of the old tenant's data");
        }
    });
    assert_eq!(agent.stop(), 0, "clean exit; log:\n{}", agent.log_tail(40));
}
