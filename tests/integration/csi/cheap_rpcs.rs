//! The cheap calls (Probe, GetCapacity, ListVolumes) answer from the views the actors
//! publish, never a torn one, while a drive comes and goes and volumes are created and
//! deleted, all at once, on real loop drives through the CSI socket.
//!
//! Setup: drive `a` (1 GiB) holds three stable volumes made first; drive `b` (64 MiB,
//! smaller than any free extent of `a`) is detached and attached again in a loop; one
//! thread creates and deletes volumes; readers call the cheap RPCs throughout.
//!
//! Rules checked on every answer:
//! - Probe, once ready, stays ready;
//! - GetCapacity: `maximum_volume_size <= available_capacity <=` the usable bytes of
//!   both drives, and what it promises is kept: a CreateVolume of exactly
//!   `maximum_volume_size` right after (once the largest extent, on `a`, is larger than
//!   all of `b`, whose coming and going cannot change it) succeeds with that size;
//! - a ListVolumes walk two entries a page, while volumes come and go, never shows a
//!   volume twice, shows every stable volume exactly once, ends with an empty token,
//!   and its tokens stay valid (no ABORTED);
//! - at the end everything made is deleted, and nothing is left on the drives.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use drivelet::grpc::proto::csi;

/// Drive-event cycles (detach and attach of `b`) the test runs.
const CYCLES: usize = 6;

/// The usable bytes of a drive of `size` (the region between the two GPTs).
fn usable(size: u64) -> u64 {
    drivelet::disk::gpt::usable_region(size, 512).map(|(s, e)| e - s).unwrap()
}

/// One ListVolumes walk, `per` entries a page: the ids in the order shown.
async fn walk(c: &mut Csi, per: i32) -> Vec<String> {
    let mut ids = Vec::new();
    let mut token = String::new();
    loop {
        let r = c
            .ctrl
            .list_volumes(csi::ListVolumesRequest { max_entries: per, starting_token: token.clone() })
            .await
            .unwrap_or_else(|e| panic!("ListVolumes with token {token:?} (after {ids:?}): {e}"))
            .into_inner();
        assert!(per == 0 || r.entries.len() <= per as usize, "a page of {} entries for max_entries {per}", r.entries.len());
        ids.extend(r.entries.into_iter().map(|e| e.volume.expect("an entry has its volume").volume_id));
        if r.next_token.is_empty() {
            return ids;
        }
        token = r.next_token;
    }
}

#[test]
fn cheap_rpcs_never_answer_a_torn_view_while_drives_and_volumes_change() {
    require_host();
    let tmp = short_tempdir();
    let a = LoopDrive::new(tmp.path(), "a.img", GIB);
    sh("udevadm", &["settle"]);
    let agent = Arc::new(Agent::start(tmp.path(), AgentOpts::default()));
    let rt = rt();
    let mut c = rt.block_on(Csi::connect(&agent));

    // Stable volumes, on `a` (the only drive yet).
    let stable: BTreeSet<String> = (0..3)
        .map(|i| {
            let req = create_req(&format!("pvc-stable-{i}"), 16 * MIB, block_cap());
            rt.block_on(c.ctrl.create_volume(req)).unwrap_or_else(|e| panic!("CreateVolume stable {i}: {e}")).into_inner().volume.unwrap().volume_id
        })
        .collect();
    let bound = usable(GIB) + usable(64 * MIB);

    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));

    // Readers: Probe, GetCapacity, ListVolumes walks.
    let readers: Vec<_> = (0..2)
        .map(|n| {
            let (agent, stop, calls, stable) = (agent.clone(), stop.clone(), calls.clone(), stable.clone());
            std::thread::spawn(move || {
                let rt = crate::common::rt();
                let mut c = rt.block_on(Csi::connect(&agent));
                while !stop.load(Ordering::SeqCst) {
                    let ready = rt.block_on(c.id.probe(csi::ProbeRequest {})).expect("Probe").into_inner().ready;
                    assert_eq!(ready, Some(true), "reader {n}: Probe stopped saying ready");
                    let cap = rt.block_on(c.ctrl.get_capacity(capacity_req(block_cap()))).expect("GetCapacity").into_inner();
                    let (avail, max) = (cap.available_capacity as u64, cap.maximum_volume_size.unwrap_or(0) as u64);
                    assert!(max <= avail, "reader {n}: maximum {max} exceeds available {avail}");
                    assert!(avail <= bound, "reader {n}: available {avail} exceeds both drives' usable {bound}");
                    let ids = rt.block_on(walk(&mut c, 2));
                    let seen: BTreeSet<&String> = ids.iter().collect();
                    assert_eq!(seen.len(), ids.len(), "reader {n}: a walk showed a volume twice: {ids:?}");
                    for s in &stable {
                        assert!(seen.contains(s), "reader {n}: a walk skipped stable volume {s}: {ids:?}");
                    }
                    calls.fetch_add(3, Ordering::SeqCst);
                }
            })
        })
        .collect();

    // Volumes come and go: each created at exactly the maximum GetCapacity promised.
    let churn = {
        let (agent, stop) = (agent.clone(), stop.clone());
        std::thread::spawn(move || {
            let rt = crate::common::rt();
            let mut c = rt.block_on(Csi::connect(&agent));
            let mut n = 0usize;
            while !stop.load(Ordering::SeqCst) {
                // The kernel's view of the last deleted partition catches up a moment
                // after DeleteVolume answered (placement counts it as used until then).
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                let max = loop {
                    let cap = rt.block_on(c.ctrl.get_capacity(capacity_req(block_cap()))).expect("GetCapacity").into_inner();
                    let max = cap.maximum_volume_size.unwrap_or(0) as u64;
                    if max > usable(64 * MIB) {
                        break max;
                    }
                    assert!(std::time::Instant::now() < deadline, "the largest extent is {max} 10 s after the last delete");
                    std::thread::sleep(Duration::from_millis(20));
                };
                let name = format!("pvc-churn-{n}");
                let v = rt
                    .block_on(c.ctrl.create_volume(create_req(&name, max, block_cap())))
                    .unwrap_or_else(|e| panic!("{name}: CreateVolume of the promised maximum {max}: {e}"))
                    .into_inner()
                    .volume
                    .unwrap();
                assert_eq!(v.capacity_bytes as u64, max, "{name}: the size asked for");
                rt.block_on(c.ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: v.volume_id.clone(), ..Default::default() }))
                    .unwrap_or_else(|e| panic!("{name}: DeleteVolume: {e}"));
                n += 1;
            }
            n
        })
    };

    // Drive events: `b` comes and goes.
    for i in 0..CYCLES {
        let mut b = LoopDrive::new(tmp.path(), "b.img", 64 * MIB);
        std::thread::sleep(Duration::from_millis(300));
        b.detach();
        std::thread::sleep(Duration::from_millis(200));
        assert!(!churn.is_finished() && readers.iter().all(|r| !r.is_finished()), "a thread failed in cycle {i}");
    }
    stop.store(true, Ordering::SeqCst);
    let cycles = churn.join().unwrap_or_else(|_| panic!("the create/delete thread failed; log:\n{}", agent.log_tail(30)));
    for r in readers {
        r.join().unwrap_or_else(|_| panic!("a reader failed; log:\n{}", agent.log_tail(30)));
    }
    println!("{} cheap calls, {cycles} create/delete cycles, {CYCLES} drive cycles", calls.load(Ordering::SeqCst));
    assert!(cycles >= 1 && calls.load(Ordering::SeqCst) >= 30, "the threads ran");

    for id in &stable {
        rt.block_on(c.ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() })).expect("DeleteVolume stable");
    }
    assert!(rt.block_on(walk(&mut c, 0)).is_empty(), "no volume is left");
    assert!(kernel_parts(&a.dev).is_empty(), "kernel partitions left on a: {:?}", kernel_parts(&a.dev));
    let mut agent = Arc::try_unwrap(agent).unwrap_or_else(|_| panic!("the agent is still shared"));
    assert_eq!(agent.stop(), 0, "the agent stops cleanly");
    assert!(!agent.logs().contains("panicked"), "the agent's log has a panic:\n{}", agent.log_tail(60));
}
