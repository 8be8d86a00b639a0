//! Partition slots are capacity, on real loop drives through the CSI socket: a drive
//! holds as many volumes as the kernel gives one disk (255 partitions), then offers
//! nothing more however many bytes it has free, says why when asked for one more, and
//! another drive with room still takes volumes; a drive whose table drivelet wrote with
//! 128 entries grows to 256 at its next write, keeping every partition.
//!
//! The rules checked:
//! - 255 block volumes of 1 MiB are made on one drive with hundreds of MiB left;
//! - then GetCapacity answers 0, `ctl drives` shows 0 free slots beside the free bytes,
//!   and the next CreateVolume is RESOURCE_EXHAUSTED, naming the drive and the limit;
//! - a drive attached then takes the next volume, and GetCapacity offers its room;
//! - a volume deleted from the full drive frees its slot: the drive takes one again;
//! - an old 128-entry table (made by the GPT library as drivelet used to) is grown to
//!   256 by the first create, its volume still listed in it and read by `sfdisk`.

use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use crate::common::*;
use drivelet::grpc::proto::csi;
use tonic::Code;

/// The most partitions the kernel gives one disk.
const SLOTS: u64 = 255;

async fn capacity(c: &mut Csi) -> (u64, u64) {
    let r = c.ctrl.get_capacity(csi::GetCapacityRequest { volume_capabilities: vec![block_cap()], ..Default::default() }).await.expect("GetCapacity").into_inner();
    (r.available_capacity as u64, r.maximum_volume_size.unwrap_or(0) as u64)
}

/// The ctl entry of drive `d` once `f` holds for it, at most 20 s.
fn wait_ctl(agent: &Agent, d: &LoopDrive, what: &str, f: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let all = agent.ctl_drives();
        if let Some(e) = drive_by_path(&all, &d.dev).filter(|e| f(e)) {
            return e.clone();
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{}: not {what} within 20 s: {all}\n{}", d.dev.display(), agent.log_tail(30));
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_drive_full_of_partitions_offers_nothing_says_why_and_another_drive_takes_the_next_volume() {
    require_host();
    let tmp = short_tempdir();
    let full = LoopDrive::new(tmp.path(), "full.img", 512 * MIB);
    sh("udevadm", &["settle"]);
    let agent = Agent::start(tmp.path(), AgentOpts::default());
    let mut other: Option<LoopDrive> = None;
    rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        let started = Instant::now();
        let mut ids = Vec::new();
        for n in 0..SLOTS {
            let r = c
                .ctrl
                .create_volume(create_req(&format!("pvc-{n}"), MIB, block_cap()))
                .await
                .unwrap_or_else(|e| panic!("volume {n}: {e}\n{}", agent.log_tail(30)))
                .into_inner();
            ids.push(r.volume.unwrap_or_default().volume_id);
        }
        let took = started.elapsed();
        eprintln!("{SLOTS} creates on one drive: {took:?} ({:?} each)", took / SLOTS as u32);
        let entries = gpt_entries(&full.dev);
        assert_eq!(entries.len() as u64, SLOTS, "the table lists every volume");
        assert_eq!(kernel_parts(&full.dev).len() as u64, SLOTS, "the kernel has every partition");

        // Full: nothing offered, with hundreds of MiB free.
        assert_eq!(capacity(&mut c).await, (0, 0), "a drive with no free slot offers nothing");
        let e = wait_ctl(&agent, &full, "showing 0 free slots", |e| e["slots_free"] == 0);
        assert_eq!(e["partition_slots"], SLOTS);
        assert!(e["free_bytes"].as_u64().unwrap() > 200 * MIB, "bytes are free all the same: {e}");
        let err = c.ctrl.create_volume(create_req("one-more", MIB, block_cap())).await.expect_err("no slot left");
        assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
        let want = format!("no free partition slot: drive {} holds 255 partitions (volumes and snapshots), the most its partition table can", full.dev.display());
        assert!(err.message().contains(&want), "{}", err.message());

        // The table shows in `ctl drives` beside the free bytes.
        let out = std::process::Command::new(bin()).args(["ctl", "--socket", agent.admin_socket.to_str().unwrap(), "drives"]).output().unwrap();
        let table = String::from_utf8_lossy(&out.stdout);
        let header = table.lines().next().unwrap_or_default();
        assert!(header.contains("FREE") && header.contains("SLOTS"), "{table}");

        // Another drive with room takes the next volume.
        let o = LoopDrive::new(tmp.path(), "other.img", 64 * MIB);
        // (No `udevadm settle`: udev is still busy with the full drive's partitions.)
        wait_ctl(&agent, &o, "managed", |e| e["class"] == "managed");
        agent.wait_drives_clean();
        let (start, end) = drivelet::disk::gpt::usable_region(64 * MIB, 512).unwrap();
        let start_wait = Instant::now();
        while capacity(&mut c).await != (end - start, end - start) {
            assert!(start_wait.elapsed() < Duration::from_secs(20), "the new drive's room is not offered: {:?}", capacity(&mut c).await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        c.ctrl.create_volume(create_req("one-more", MIB, block_cap())).await.unwrap_or_else(|e| panic!("the other drive: {e}"));
        assert_eq!(gpt_entries(&o.dev).len(), 1, "it went to the drive with room");
        other = Some(o);

        // A volume deleted frees its slot on the full drive at once: placement counts
        // the volume manager's records (the inventory's count follows once udev has
        // worked through its backlog of the full drive's partition events).
        c.ctrl.delete_volume(del_req(&ids[100])).await.expect("delete");
        let made = c.ctrl.create_volume(create_req("in-the-freed-slot", 128 * MIB, block_cap())).await.expect("a slot is free").into_inner();
        assert_eq!(made.volume.unwrap_or_default().capacity_bytes as u64, 128 * MIB);
        assert_eq!(gpt_entries(&full.dev).len() as u64, SLOTS, "the big volume took the freed slot on the full drive");
    });
    drop(agent);
    drop(other);
}

/// The crash points of a table's growth from 128 entries to 256, in their order (each
/// has a kill -9 case below; tests/integration/robustness/crash.rs lists them).
pub(crate) const GROW_POINTS: &[&str] = &["grow.backup_written", "grow.primary_array_written"];

/// Writes a drivelet GPT of 128 entries and no partition (as drivelet wrote its tables
/// before it made them of 256) and a protective MBR on the device `dev`, with the GPT
/// library drivelet used then.
fn legacy_table(dev: &std::path::Path) {
    let f = std::fs::OpenOptions::new().read(true).write(true).open(dev).unwrap();
    let size = dev_size(dev);
    let mut disk = gpt::GptConfig::new()
        .writable(true)
        .logical_block_size(gpt::disk::LogicalBlockSize::Lb512)
        .create_from_device(&f, Some(drivelet::disk::gpt::new_disk_guid()))
        .unwrap();
    disk.update_partitions(Default::default()).unwrap();
    assert_eq!(disk.header().num_parts, 128);
    disk.write_inplace().unwrap();
    gpt::mbr::ProtectiveMBR::with_lb_size(u32::try_from(size / 512 - 1).unwrap()).overwrite_lba0(&mut &f).unwrap();
    f.sync_all().unwrap();
}

/// The entry counts the primary and the backup header of `dev` name (read through the
/// device, O_DIRECT: the page cache of the whole disk may hold older blocks).
fn entries(dev: &std::path::Path) -> (u32, u32) {
    let size = dev_size(dev);
    let at = |off: u64| {
        let mut a = Aligned::new(4096, 0);
        let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(dev).unwrap();
        use std::os::unix::fs::FileExt;
        let base = off / 4096 * 4096;
        f.read_exact_at(a.buf(), base).unwrap();
        let h = &a.buf()[(off - base) as usize..];
        assert_eq!(&h[..8], b"EFI PART", "a GPT header at byte {off}");
        u32::from_le_bytes([h[80], h[81], h[82], h[83]])
    };
    (at(512), at(size - 512))
}

/// An agent over one loop drive of `size` bytes that holds an old 128-entry drivelet
/// table, ready and done cleaning it.
fn old_table_agent(tmp: &std::path::Path, size: u64) -> (LoopDrive, Agent) {
    let drive = LoopDrive::new(tmp, "old.img", size);
    legacy_table(&drive.dev);
    sh("udevadm", &["settle"]);
    let agent = Agent::start(tmp, AgentOpts::default());
    let e = wait_ctl(&agent, &drive, "managed", |e| e["class"] == "managed");
    assert_eq!(e["partition_slots"], SLOTS, "a table that can grow counts the kernel's slots: {e}");
    assert_eq!(entries(&drive.dev), (128, 128), "nothing grew it before a volume was made");
    (drive, agent)
}

#[test]
fn an_old_128_entry_table_grows_to_256_at_its_first_create_and_holds_more_than_128_volumes() {
    require_host();
    let tmp = short_tempdir();
    let (drive, agent) = old_table_agent(tmp.path(), 256 * MIB);
    rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        for n in 0..130 {
            c.ctrl.create_volume(create_req(&format!("pvc-{n}"), MIB, block_cap())).await.unwrap_or_else(|e| panic!("volume {n}: {e}\n{}", agent.log_tail(30)));
            if n == 0 {
                assert_eq!(entries(&drive.dev), (256, 256), "the first create grew both copies");
            }
        }
    });
    assert_eq!(gpt_entries(&drive.dev).len(), 130, "sfdisk reads all 130");
    assert_eq!(kernel_parts(&drive.dev).len(), 130, "the kernel has all 130");
    wait_ctl(&agent, &drive, "showing 125 free slots", |e| e["slots_free"] == 125);
    drop(agent);
    drop(drive);
}

#[test]
fn a_growth_killed_at_any_point_leaves_a_readable_table_and_the_retried_create_grows_it() {
    assert!(cfg!(feature = "failpoints"), "crash tests need `--features failpoints`; scripts/test.sh passes it");
    require_host();
    for point in GROW_POINTS {
        let tmp = short_tempdir();
        let (drive, mut agent) = old_table_agent(tmp.path(), 128 * MIB);
        agent.arm(point, "return");
        rt().block_on(async {
            let mut c = Csi::connect(&agent).await;
            let e = c.ctrl.create_volume(create_req("pvc-a", 4 * MIB, block_cap())).await.expect_err("the agent dies at the crash point");
            assert!(matches!(e.code(), Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled), "{point}: {e}");
        });
        let status = agent.wait_exit(Duration::from_secs(20)).unwrap_or_else(|| panic!("{point}: the agent did not die"));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "{point}: killed by SIGKILL at the point");
        // The table as the kill left it: one copy grown, the other not (both readable).
        let (primary, backup) = entries(&drive.dev);
        assert_eq!((primary, backup), (128, 256), "{point}: the backup copy grew first");
        agent.spawn();
        wait_ctl(&agent, &drive, "managed after the restart", |e| e["class"] == "managed");
        rt().block_on(async {
            let mut c = Csi::connect(&agent).await;
            let made = c.ctrl.create_volume(create_req("pvc-a", 4 * MIB, block_cap())).await.unwrap_or_else(|e| panic!("{point}: the retry: {e}\n{}", agent.log_tail(40)));
            assert_eq!(made.into_inner().volume.unwrap_or_default().capacity_bytes as u64, 4 * MIB);
            c.ctrl.create_volume(create_req("pvc-b", 4 * MIB, block_cap())).await.unwrap_or_else(|e| panic!("{point}: another: {e}"));
        });
        assert_eq!(entries(&drive.dev), (256, 256), "{point}: both copies grown after the retry");
        let names: Vec<String> = gpt_entries(&drive.dev).into_iter().map(|e| e.name).collect();
        assert_eq!(names, ["drivelet:pvc-a", "drivelet:pvc-b"], "{point}");
        assert_eq!(kernel_parts(&drive.dev).len(), 2, "{point}");
        assert_eq!(agent.stop(), 0);
        drop(drive);
    }
}
