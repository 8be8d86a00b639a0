//! Symlink swaps raced against every node call that takes a path: nothing is ever
//! mounted, created or unmounted outside the allowed root.
//!
//! A swapper thread exchanges (`renameat2(RENAME_EXCHANGE)`, atomic) a real directory or
//! file inside the kubelet root with a symlink to a directory outside it, as fast as it
//! can, at the staging path, the filesystem target's parent (an intermediate component)
//! or the block target, one of them each round. Meanwhile every round calls
//! NodeStageVolume, NodePublishVolume (filesystem and block), NodeGetVolumeStats,
//! NodeExpandVolume, NodeUnpublishVolume and NodeUnstageVolume. Each call may succeed
//! or be refused (a symlink was there); what must hold after every round:
//! - nothing is mounted at or under the outside directory;
//! - the outside directory holds exactly what it held (no file or directory made).
//!
//! At the end the swaps stop, the real entries are put back, and the volumes are
//! unpublished and unstaged normally: nothing of them stays mounted.
//!
//! Rounds: `DRIVELET_RACE_ROUNDS` (default 2000, about two minutes).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::common::*;
use drivelet::grpc::proto::csi;

const MIB: u64 = 1 << 20;

fn rounds() -> usize {
    std::env::var("DRIVELET_RACE_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000)
}

/// The names under `dir`, recursively (what the outside directory holds).
fn tree(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(p.clone());
            }
            out.insert(p);
        }
    }
    out
}

/// Exchanges `a` and `b` atomically; `false` when the kernel refused (one is a mount
/// point now: busy).
fn exchange(a: &Path, b: &Path) -> bool {
    nix::fcntl::renameat2(nix::fcntl::AT_FDCWD, a, nix::fcntl::AT_FDCWD, b, nix::fcntl::RenameFlags::RENAME_EXCHANGE).is_ok()
}

/// One raced entry: the real one at `at`, a symlink out at `spare`; an exchange flips
/// them.
struct Swap {
    at: PathBuf,
    spare: PathBuf,
    /// Where the symlink points.
    to: PathBuf,
    /// The real entry is a directory (else a file).
    dir: bool,
}

#[test]
fn symlink_swaps_raced_against_every_path_call_never_reach_outside_the_root() {
    require_host();
    let tmp = short_tempdir();
    let _u = Unmounter(tmp.path().to_path_buf());
    let _drive = LoopDrive::new(tmp.path(), "a.img", 512 * MIB);
    sh("udevadm", &["settle"]);
    let kubelet = tmp.path().join("kubelet");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(outside.join("etc")).unwrap();
    std::fs::write(outside.join("etc/passwd"), b"root:x:0:0").unwrap();
    std::fs::write(outside.join("victim"), b"keep").unwrap();
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    let before_outside = tree(&outside);

    // The entries raced: each exists as itself at `at` and as a symlink out at `spare`;
    // an exchange flips them.
    let plugins = kubelet.join("plugins/race");
    let pod = kubelet.join("pods/p/volumes");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::create_dir_all(&pod).unwrap();
    let staging = plugins.join("stage");
    let fs_target = pod.join("fs/mount");
    let blk_target = pod.join("blk");
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::create_dir_all(&fs_target).unwrap();
    std::fs::write(&blk_target, b"").unwrap();
    let fs_parent = pod.join("fs");
    let mut swaps = Vec::new();
    for (at, to, dir) in [(&staging, outside.join("etc"), true), (&fs_parent, outside.clone(), true), (&blk_target, outside.join("victim"), false)] {
        let spare = at.with_extension("spare");
        std::os::unix::fs::symlink(&to, &spare).unwrap();
        swaps.push(Swap { at: at.clone(), spare, to, dir });
    }

    let rt = rt();
    let (fs_vol, blk_vol) = rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let fs_vol = c.ctrl.create_volume(create_req("race-fs", 32 * MIB, mount_cap("ext4"))).await.unwrap().into_inner().volume.unwrap().volume_id;
        let blk_vol = c.ctrl.create_volume(create_req("race-blk", 16 * MIB, block_cap())).await.unwrap().into_inner().volume.unwrap().volume_id;
        (fs_vol, blk_vol)
    });
    let blk_staging = plugins.join("blk-stage");
    std::fs::create_dir_all(&blk_staging).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let flips = Arc::new(AtomicU64::new(0));
    let active = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let swapper = {
        let (stop, flips, active) = (stop.clone(), flips.clone(), active.clone());
        let pairs: Vec<(PathBuf, PathBuf, PathBuf, bool)> = swaps.iter().map(|s| (s.at.clone(), s.spare.clone(), s.to.clone(), s.dir)).collect();
        std::thread::spawn(move || {
            let is_link = |p: &Path| std::fs::symlink_metadata(p).ok().map(|m| m.file_type().is_symlink());
            // drivelet removes a target it unpublished, the symlink too when one is
            // there then (never what it points at): the missing name is made again.
            let mend = |at: &Path, spare: &Path, to: &Path, dir: bool| {
                for (p, other) in [(at, spare), (spare, at)] {
                    if is_link(p).is_none() {
                        match is_link(other) {
                            Some(false) | None => drop(std::os::unix::fs::symlink(to, p)),
                            Some(true) if dir => drop(std::fs::create_dir_all(p)),
                            Some(true) => drop(std::fs::write(p, b"")),
                        }
                    }
                }
            };
            // One entry is raced at a time (the round picks it); the others are put
            // back in place. A pause of 0 to 255 µs between flips lets calls find the
            // entry either way.
            // A real entry moved away between drivelet's open and its mount got the mount
            // under its other name (still inside the root: the directory drivelet
            // checked). A mount point cannot be renamed back, so such a mount is taken
            // off and counted, and the rounds go on with the entry in place.
            let mut landed_elsewhere = 0;
            let is_mount = |p: &Path| mounts_under(p).iter().any(|m| m == p);
            let mut pause = 0x9e37_79b9u32;
            while !stop.load(Ordering::Relaxed) {
                let now = active.load(Ordering::Relaxed) % pairs.len();
                for (i, (at, spare, to, dir)) in pairs.iter().enumerate() {
                    mend(at, spare, to, *dir);
                    if i != now && is_link(at) != Some(true) {
                        continue;
                    }
                    if exchange(at, spare) {
                        flips.fetch_add(1, Ordering::Relaxed);
                    } else if is_link(at) == Some(true) && is_mount(spare) {
                        landed_elsewhere += 1;
                        let _ = nix::mount::umount2(spare.as_path(), nix::mount::MntFlags::MNT_DETACH);
                    }
                }
                pause ^= pause << 13;
                pause ^= pause >> 17;
                pause ^= pause << 5;
                std::thread::sleep(std::time::Duration::from_micros(u64::from(pause & 0xff)));
            }
            // Put the real entries back in place: parents before what lies beneath them
            // (mending a name beneath a parent still swapped would act through the
            // symlink), twice over, so an entry the first pass found missing is made.
            let mut back: Vec<&(PathBuf, PathBuf, PathBuf, bool)> = pairs.iter().collect();
            back.sort_by_key(|(at, ..)| at.components().count());
            for (at, spare, to, dir) in back.iter().copied().chain(back.iter().copied()) {
                mend(at, spare, to, *dir);
                if is_link(at) == Some(true) {
                    if !exchange(at, spare) {
                        landed_elsewhere += 1;
                        nix::mount::umount2(spare.as_path(), nix::mount::MntFlags::MNT_DETACH).unwrap_or_else(|e| panic!("{}: {e}", spare.display()));
                    }
                    assert!(exchange(at, spare), "{} put back", at.display());
                }
            }
            landed_elsewhere
        })
    };

    let n = rounds();
    let mut outcomes = std::collections::BTreeMap::<&str, (u32, u32)>::new();
    let mut tally = |what: &'static str, ok: bool| {
        let e = outcomes.entry(what).or_default();
        if ok {
            e.0 += 1
        } else {
            e.1 += 1
        }
    };
    let started = std::time::Instant::now();
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        for round in 0..n {
            active.store(round, Ordering::Relaxed);
            let r = c.node.node_stage_volume(stage_req(&fs_vol, &staging, mount_cap("ext4"))).await;
            tally("stage fs", r.is_ok());
            let r = c.node.node_stage_volume(stage_req(&blk_vol, &blk_staging, block_cap())).await;
            tally("stage block", r.is_ok());
            let r = c.node.node_publish_volume(publish_req(&fs_vol, &staging, &fs_target, mount_cap("ext4"), round % 2 == 0)).await;
            tally("publish fs", r.is_ok());
            let r = c.node.node_publish_volume(publish_req(&blk_vol, &blk_staging, &blk_target, block_cap(), false)).await;
            tally("publish block", r.is_ok());
            let r = c.node.node_get_volume_stats(csi::NodeGetVolumeStatsRequest { volume_id: fs_vol.clone(), volume_path: fs_target.display().to_string(), staging_target_path: String::new() }).await;
            tally("stats", r.is_ok());
            let r = c
                .node
                .node_expand_volume(csi::NodeExpandVolumeRequest { volume_id: fs_vol.clone(), volume_path: fs_target.display().to_string(), ..Default::default() })
                .await;
            tally("expand", r.is_ok());
            let r = c.node.node_unpublish_volume(unpublish_req(&fs_vol, &fs_target)).await;
            tally("unpublish fs", r.is_ok());
            let r = c.node.node_unpublish_volume(unpublish_req(&blk_vol, &blk_target)).await;
            tally("unpublish block", r.is_ok());
            let r = c.node.node_unstage_volume(unstage_req(&fs_vol, &staging)).await;
            tally("unstage fs", r.is_ok());

            let escaped: Vec<PathBuf> = mounts_under(&outside);
            assert!(escaped.is_empty(), "round {round}: mounted outside the root: {escaped:?}\n{}", agent.log_tail(20));
            assert_eq!(tree(&outside), before_outside, "round {round}: the outside directory changed\n{}", agent.log_tail(20));
        }
    });
    stop.store(true, Ordering::Relaxed);
    let landed_elsewhere = swapper.join().unwrap();
    let took = started.elapsed();
    println!(
        "{n} rounds in {took:?}, {} swaps, {landed_elsewhere} mount(s) on a checked directory renamed meanwhile; per call (ok, refused): {outcomes:?}",
        flips.load(Ordering::Relaxed)
    );
    assert!(flips.load(Ordering::Relaxed) as usize > n, "the swapper raced: {} swaps", flips.load(Ordering::Relaxed));
    for what in ["stage fs", "publish fs", "publish block", "unpublish block", "unstage fs"] {
        let (ok, refused) = outcomes.get(what).copied().unwrap_or_default();
        assert!(ok > 0 && refused > 0, "{what}: both outcomes seen over {n} rounds (ok {ok}, refused {refused}): the race was real");
    }

    // With the entries back in place, everything comes undone by the normal calls.
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        c.node.node_unpublish_volume(unpublish_req(&fs_vol, &fs_target)).await.unwrap();
        c.node.node_unpublish_volume(unpublish_req(&blk_vol, &blk_target)).await.unwrap();
        c.node.node_unstage_volume(unstage_req(&fs_vol, &staging)).await.unwrap();
        c.node.node_unstage_volume(unstage_req(&blk_vol, &blk_staging)).await.unwrap();
    });
    assert!(mounts_under(tmp.path()).is_empty(), "left mounted: {:?}", mounts_under(tmp.path()));
    assert_eq!(tree(&outside), before_outside);
    assert_eq!(std::fs::read(outside.join("etc/passwd")).unwrap(), b"root:x:0:0");
    assert!(!agent.logs().contains("panicked"));
    assert_eq!(agent.stop(), 0);
}
