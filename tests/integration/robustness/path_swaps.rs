//! A path checked once is never looked up again: each step that checks a staging path
//! and then acts on it (a frozen xfs clone reading its space map, NodeExpandVolume
//! growing the filesystem, the health poller reading and measuring it) is held between
//! the check and the act (a fail point, `return(MS)`), and meanwhile the path's parent
//! is exchanged (`renameat2(RENAME_EXCHANGE)`) with a symlink to a directory outside the
//! root where another filesystem, a decoy, is mounted under the same name. So the race
//! the symlink-swap test of the publish path ([`super::race`]) runs by chance happens
//! here every run, at the one moment that matters. What must hold:
//! - the clone holds the source's bytes: its space map is the frozen source's, not the
//!   decoy's (whose used extents miss the source's data);
//! - the volume grows and the decoy (an xfs with room on its device to grow) does not;
//!   online ext4 growth acts on the descriptor checked (with CAP_SYS_RESOURCE it grows
//!   that filesystem; without it the ext4 refusal is what answers, not the decoy xfs's);
//! - the health check reports the volume's own usage (low), never the decoy's (full),
//!   and the next check, finding the symlink, reports the path replaced and reads
//!   nothing through it;
//! - an unstage whose recorded staging path leads, after a rename, to another volume's
//!   mount is refused in words and unmounts nothing: each layer is checked to be of the
//!   volume's own device on the descriptor that precedes its unmount.
//!
//! The held tests need `--features failpoints` (scripts/test.sh passes it) and fail
//! without it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::*;
use drivelet::grpc::proto::csi;

/// Exchanges `a` and `b` atomically.
fn exchange(a: &Path, b: &Path) {
    nix::fcntl::renameat2(nix::fcntl::AT_FDCWD, a, nix::fcntl::AT_FDCWD, b, nix::fcntl::RenameFlags::RENAME_EXCHANGE)
        .unwrap_or_else(|e| panic!("exchange {} and {}: {e}", a.display(), b.display()));
}

/// The filesystem type the name `path` leads to now (`stat -f`), following symlinks.
fn fs_type_at(path: &Path) -> String {
    sh("stat", &["-f", "-c", "%T", path.to_str().unwrap()])
}

/// Bytes of the filesystem the name `path` leads to now (statvfs), following symlinks.
fn fs_bytes_at(path: &Path) -> u64 {
    let st = nix::sys::statvfs::statvfs(path).unwrap_or_else(|e| panic!("statvfs {}: {e}", path.display()));
    st.blocks() as u64 * st.fragment_size() as u64
}

/// A staging path's parent `dir` inside the root, and beside it `dir.spare`, a symlink
/// to `outside`, where a decoy filesystem is mounted at the same name as the staging
/// path's last component. [`Swap::flip`] exchanges the two.
struct Swap {
    dir: PathBuf,
    spare: PathBuf,
    swapped: bool,
}

impl Swap {
    fn new(dir: &Path, outside: &Path) -> Swap {
        std::fs::create_dir_all(dir).unwrap();
        let spare = dir.with_extension("spare");
        std::os::unix::fs::symlink(outside, &spare).unwrap();
        Swap { dir: dir.to_path_buf(), spare, swapped: false }
    }

    fn flip(&mut self) {
        exchange(&self.dir, &self.spare);
        self.swapped = !self.swapped;
    }
}

impl Drop for Swap {
    fn drop(&mut self) {
        if self.swapped {
            let _ = nix::fcntl::renameat2(nix::fcntl::AT_FDCWD, &self.dir, nix::fcntl::AT_FDCWD, &self.spare, nix::fcntl::RenameFlags::RENAME_EXCHANGE);
        }
    }
}

/// A decoy filesystem: `mkfs` `args` on a loop device of `size` bytes (a file the
/// agent does not manage), mounted at `at`; unmounted (then detached) on drop.
struct Decoy {
    at: PathBuf,
    _drive: LoopDrive,
}

impl Decoy {
    fn new(dir: &Path, name: &str, size: u64, mkfs: &[&str], at: &Path) -> Decoy {
        let drive = LoopDrive::new(dir, name, size);
        let mut args: Vec<&str> = mkfs[1..].to_vec();
        args.push(drive.dev.to_str().unwrap());
        sh(mkfs[0], &args);
        std::fs::create_dir_all(at).unwrap();
        sh("mount", &[drive.dev.to_str().unwrap(), at.to_str().unwrap()]);
        Decoy { at: at.to_path_buf(), _drive: drive }
    }
}

impl Drop for Decoy {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.at).status();
    }
}

/// Waits until the agent says it holds at the fail point `point` for `path`.
fn wait_for_hold(agent: &Agent, point: &str, path: &Path) {
    let t0 = Instant::now();
    let path = path.display().to_string();
    while !agent.logs().lines().any(|l| l.contains("fail point: holding here") && l.contains(point) && l.contains(&path)) {
        assert!(t0.elapsed() < Duration::from_secs(60), "the agent never held at {point} for {path}; log:\n{}", agent.log_tail(40));
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `n` bytes of a pattern no zeroed or foreign extent holds.
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i.wrapping_mul(31) % 251) as u8 ^ 0x5a).collect()
}

/// DeleteVolume, retried for up to 10 s while the partition is busy, as a CO retries: a
/// test running beside this one may be cloning, and its tools run in a mount namespace
/// of their own holding a copy of every mount of the host, ours too (on a host whose
/// `/` is private, as this one's, an unmount does not reach that copy) until they end.
async fn delete(c: &mut Csi, agent: &Agent, id: &str) {
    let t0 = Instant::now();
    loop {
        match c.ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: id.to_string(), ..Default::default() }).await {
            Ok(_) => return,
            Err(e) if e.message().contains("is busy") && t0.elapsed() < Duration::from_secs(10) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("delete {id}: {e:?}\n{}", agent.log_tail(30)),
        }
    }
}

fn needs_failpoints() {
    assert!(cfg!(feature = "failpoints"), "this test needs `--features failpoints`; scripts/test.sh passes it");
}

#[test]
fn a_frozen_xfs_clone_copies_the_extents_of_the_filesystem_it_froze_when_its_staging_path_is_swapped_meanwhile() {
    needs_failpoints();
    require_host();
    let tmp = short_tempdir();
    let _drive = LoopDrive::new(tmp.path(), "c.img", 2 * GIB);
    let outside = tmp.path().join("outside");
    // An empty xfs of the source's size: its used extents (metadata, log) miss the
    // source's data, so a copy by its space map holds no byte of the file.
    let _decoy = Decoy::new(tmp.path(), "decoy.raw", 320 * MIB, &["mkfs.xfs", "-f", "-q"], &outside.join("stage"));
    let _u = Unmounter(tmp.path().join("kubelet"));
    let agent = Agent::start(tmp.path(), AgentOpts::default());
    let mut swap = Swap::new(&tmp.path().join("kubelet/plugins/frozen"), &outside);
    let staging = swap.dir.join("stage");
    let data = pattern(24 << 20);
    let rt = rt();
    let src = rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let src = c.ctrl.create_volume(create_req("pvc-frozen-src", 320 * MIB, mount_cap("xfs"))).await.unwrap().into_inner().volume.unwrap().volume_id;
        c.node.node_stage_volume(stage_req(&src, &staging, mount_cap("xfs"))).await.unwrap();
        src
    });
    std::fs::write(staging.join("data.bin"), &data).unwrap();
    sh("sync", &[]);

    agent.arm("clone.frozen.hold", "1*return(1500)");
    let clone = {
        let (socket_agent, src) = (&agent, src.clone());
        std::thread::scope(|s| {
            let made = s.spawn(move || {
                crate::common::rt().block_on(async {
                    let mut c = Csi::connect(socket_agent).await;
                    c.ctrl.create_volume(clone_req("pvc-frozen-copy", 320 * MIB, 0, mount_cap("xfs"), &src)).await.map(|r| r.into_inner().volume.unwrap())
                })
            });
            wait_for_hold(&agent, "clone.frozen.hold", &staging);
            swap.flip();
            assert_eq!(fs_type_at(&staging.join(".")), "xfs");
            assert!(!staging.join("data.bin").exists(), "the staging path leads to the decoy now");
            let made = made.join().unwrap();
            swap.flip();
            made
        })
    };
    let clone = clone.unwrap_or_else(|e| panic!("the clone: {e:?}\n{}", agent.log_tail(30)));
    assert_eq!(clone.volume_context.get("drivelet.io/clone-consistency").map(String::as_str), Some("frozen"), "{:?}", clone.volume_context);

    let cst = tmp.path().join("kubelet/plugins/frozen-copy");
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        c.node.node_stage_volume(stage_req(&clone.volume_id, &cst, mount_cap("xfs"))).await.unwrap();
    });
    let copied = std::fs::read(cst.join("data.bin")).unwrap();
    assert!(copied == data, "the clone holds the source's file as it was frozen ({} bytes, {} differ)", copied.len(), copied.iter().zip(&data).filter(|(a, b)| a != b).count());
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        c.node.node_unstage_volume(unstage_req(&clone.volume_id, &cst)).await.unwrap();
        c.node.node_unstage_volume(unstage_req(&src, &staging)).await.unwrap();
        for id in [&clone.volume_id, &src] {
            delete(&mut c, &agent, id).await;
        }
    });
    assert!(!agent.logs().contains("panicked"));
}

#[test]
fn node_expand_grows_the_filesystem_it_checked_when_the_staging_path_is_swapped_meanwhile() {
    needs_failpoints();
    require_host();
    let tmp = short_tempdir();
    let _drive = LoopDrive::new(tmp.path(), "g.img", 2 * GIB);
    let outside = tmp.path().join("outside");
    // A decoy xfs of 320 MiB on a device of 640: a growth aimed at it would grow it.
    let decoy = Decoy::new(tmp.path(), "decoy.raw", 640 * MIB, &["mkfs.xfs", "-f", "-q", "-d", "size=320m"], &outside.join("stage"));
    let decoy_bytes = fs_bytes_at(&decoy.at);
    let _u = Unmounter(tmp.path().join("kubelet"));
    let agent = Agent::start(tmp.path(), AgentOpts::default());
    let mut swap = Swap::new(&tmp.path().join("kubelet/plugins/grow"), &outside);
    let staging = swap.dir.join("stage");
    let rt = rt();
    let id = rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let id = c.ctrl.create_volume(create_req("pvc-grow", 320 * MIB, mount_cap("xfs"))).await.unwrap().into_inner().volume.unwrap().volume_id;
        c.node.node_stage_volume(stage_req(&id, &staging, mount_cap("xfs"))).await.unwrap();
        c.ctrl.controller_expand_volume(expand_req(&id, 512 * MIB, 0)).await.unwrap();
        id
    });
    // statvfs leaves out the internal log: a 320 MiB xfs shows about 256 MiB.
    let before = fs_bytes_at(&staging);
    assert!(before <= 320 * MIB, "the volume's filesystem starts at 320 MiB: {before}");

    agent.arm("node_expand.checked.hold", "1*return(1500)");
    let grown = std::thread::scope(|s| {
        let (a, id, st) = (&agent, id.clone(), staging.clone());
        let grown = s.spawn(move || {
            crate::common::rt().block_on(async {
                let mut c = Csi::connect(a).await;
                c.node.node_expand_volume(node_expand_req(&id, &st, 512 * MIB)).await
            })
        });
        wait_for_hold(&agent, "node_expand.checked.hold", &staging);
        swap.flip();
        assert_eq!(fs_bytes_at(&staging), decoy_bytes, "the staging path leads to the decoy now");
        let grown = grown.join().unwrap();
        swap.flip();
        grown
    });
    grown.unwrap_or_else(|e| panic!("NodeExpandVolume: {e:?}\n{}", agent.log_tail(30)));
    let after = fs_bytes_at(&staging);
    assert!(after >= before + 180 * MIB, "the volume's filesystem grew by the 192 MiB its partition did: {before} -> {after}");
    assert_eq!(fs_bytes_at(&decoy.at), decoy_bytes, "the decoy was not grown");
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        c.node.node_unstage_volume(unstage_req(&id, &staging)).await.unwrap();
        delete(&mut c, &agent, &id).await;
    });
}

#[test]
fn online_ext4_growth_acts_on_the_descriptor_checked_never_on_what_the_path_leads_to_later() {
    require_host();
    let tmp = short_tempdir();
    let root = tmp.path().join("kubelet");
    let outside = tmp.path().join("outside");
    // An ext4 of 128 MiB on a device of 256: there is room to grow.
    let real = LoopDrive::new(tmp.path(), "e4.raw", 256 * MIB);
    let _u = Unmounter(tmp.path().to_path_buf());
    sh("mkfs.ext4", &["-F", "-q", "-E", "nodiscard", real.dev.to_str().unwrap(), "128M"]);
    let mut swap = Swap::new(&root.join("plugins/e4"), &outside);
    let staging = swap.dir.join("stage");
    std::fs::create_dir_all(&staging).unwrap();
    sh("mount", &[real.dev.to_str().unwrap(), staging.to_str().unwrap()]);
    let decoy = Decoy::new(tmp.path(), "decoy.raw", 640 * MIB, &["mkfs.xfs", "-f", "-q", "-d", "size=320m"], &outside.join("stage"));
    let decoy_bytes = fs_bytes_at(&decoy.at);
    let blocks = || drivelet::disk::fs::ext4_geometry(&real.dev).unwrap().block_count;
    let before = blocks();

    let at = drivelet::disk::beneath::open(&staging, std::slice::from_ref(&root)).unwrap().expect("the staging mount");
    swap.flip();
    assert_eq!(fs_type_at(&staging.join(".")), "xfs", "the staging path leads to the decoy now");
    let grown = drivelet::disk::fs::grow(&real.dev, &at, "ext4");
    swap.flip();
    if drivelet::disk::has_capability(drivelet::disk::CAP_SYS_RESOURCE) {
        grown.unwrap_or_else(|e| panic!("online ext4 growth: {e}"));
        assert!(blocks() > before, "the ext4 checked grew: {before} -> {} blocks", blocks());
    } else {
        // The kernel's ext4 answers EPERM without CAP_SYS_RESOURCE; an xfs answers
        // ENOTTY to the ext4 ioctl. So the refusal names the capability only when the
        // ioctl reached the ext4 checked.
        let e = grown.expect_err("no online ext4 growth without CAP_SYS_RESOURCE").to_string();
        assert!(e.contains("CAP_SYS_RESOURCE") && e.contains("EXT4_IOC_RESIZE_FS") && e.contains(staging.to_str().unwrap()), "{e}");
        assert_eq!(blocks(), before);
        eprintln!("note: this machine withholds CAP_SYS_RESOURCE: the ioctl reached the ext4 checked (its EPERM), not the decoy xfs; the growth itself was not seen");
    }
    assert_eq!(fs_bytes_at(&decoy.at), decoy_bytes, "the decoy was not grown");
    drop(at);
    sh("umount", &[staging.to_str().unwrap()]);
}

#[test]
fn a_health_check_reads_the_staging_mount_it_checked_and_reports_a_swapped_path_as_replaced_never_another_filesystems_usage() {
    needs_failpoints();
    require_host();
    let tmp = short_tempdir();
    let _drive = LoopDrive::new(tmp.path(), "h.img", GIB);
    let outside = tmp.path().join("outside");
    // A decoy that is full: a check that read it would call the volume full.
    let decoy_at = outside.join("stage");
    std::fs::create_dir_all(&decoy_at).unwrap();
    sh("mount", &["-t", "tmpfs", "-o", "size=1m", "decoy", decoy_at.to_str().unwrap()]);
    let _decoy_mount = Unmounter(outside.clone());
    let _ = std::fs::write(decoy_at.join("fill"), vec![1u8; 2 << 20]);
    assert!(nix::sys::statvfs::statvfs(&decoy_at).unwrap().blocks_available() == 0, "the decoy is full");
    let _u = Unmounter(tmp.path().join("kubelet"));
    let (agent, _smart) = start_health_agent(tmp.path(), "usage_threshold_percent = 80");
    let mut swap = Swap::new(&tmp.path().join("kubelet/plugins/health"), &outside);
    let staging = swap.dir.join("stage");
    let rt = rt();
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let id = c.ctrl.create_volume(create_req("pvc-health", 64 * MIB, mount_cap("ext4"))).await.unwrap().into_inner().volume.unwrap().volume_id;
        c.node.node_stage_volume(stage_req(&id, &staging, mount_cap("ext4"))).await.unwrap();
        let condition = |c: &mut Csi| {
            let mut ctrl = c.ctrl.clone();
            let id = id.clone();
            async move {
                let r = ctrl.controller_get_volume(csi::ControllerGetVolumeRequest { volume_id: id }).await.unwrap().into_inner();
                r.status.and_then(|s| s.volume_condition).expect("a volume condition")
            }
        };
        agent.arm("health.staging.hold", "1*return(1500)");
        wait_for_hold(&agent, "health.staging.hold", &staging);
        swap.flip();
        // The held check goes on through the mount it checked (the volume's: a few
        // percent used); the next ones find the symlink and read nothing through it.
        let t0 = Instant::now();
        let replaced = loop {
            let cond = condition(&mut c).await;
            assert!(!cond.message.contains("full"), "the decoy's usage was read for the volume: {}", cond.message);
            if cond.abnormal && cond.message.contains("no longer leads to the volume's mount") {
                break cond;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "no check reported the staging path replaced: {cond:?}\n{}", agent.log_tail(30));
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(replaced.message.contains(staging.to_str().unwrap()) && replaced.message.contains("symbolic link"), "{}", replaced.message);
        swap.flip();
        let t0 = Instant::now();
        loop {
            let cond = condition(&mut c).await;
            assert!(!cond.message.contains("full"), "{}", cond.message);
            if !cond.abnormal {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "the volume stays abnormal with its path back: {cond:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!agent.logs().contains("filesystem-full"), "the decoy's usage never reached a condition");
        c.node.node_unstage_volume(unstage_req(&id, &staging)).await.unwrap();
        delete(&mut c, &agent, &id).await;
    });
}

#[test]
fn unstaging_a_volume_whose_staging_path_now_leads_to_another_volumes_mount_leaves_that_mount_alone() {
    require_host();
    let tmp = short_tempdir();
    let _drive = LoopDrive::new(tmp.path(), "u.img", GIB);
    let _u = Unmounter(tmp.path().join("kubelet"));
    let agent = Agent::start(tmp.path(), AgentOpts::default());
    let (dir_a, dir_b) = (tmp.path().join("kubelet/plugins/a"), tmp.path().join("kubelet/plugins/b"));
    let (st_a, st_b) = (dir_a.join("stage"), dir_b.join("stage"));
    rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        let mut ids = Vec::new();
        for (name, st) in [("pvc-a", &st_a), ("pvc-b", &st_b)] {
            let id = c.ctrl.create_volume(create_req(name, 64 * MIB, mount_cap("ext4"))).await.unwrap().into_inner().volume.unwrap().volume_id;
            c.node.node_stage_volume(stage_req(&id, st, mount_cap("ext4"))).await.unwrap();
            std::fs::write(st.join("owner"), name).unwrap();
            ids.push(id);
        }
        // The two staging directories' parents trade places (real directories, no
        // symlink): A's recorded staging path now leads to B's mount.
        exchange(&dir_a, &dir_b);
        assert_eq!(std::fs::read_to_string(st_a.join("owner")).unwrap(), "pvc-b");
        let e = c.node.node_unstage_volume(unstage_req(&ids[0], &st_a)).await.expect_err("A's path shows B's filesystem");
        assert!(e.message().contains("shows another filesystem") && e.message().contains("left mounted"), "{}", e.message());
        assert_eq!(std::fs::read_to_string(st_a.join("owner")).unwrap(), "pvc-b", "B's filesystem is still mounted and readable");
        assert_eq!(std::fs::read_to_string(st_b.join("owner")).unwrap(), "pvc-a", "so is A's");
        // Put back, each unstages its own.
        exchange(&dir_a, &dir_b);
        for (id, st) in ids.iter().zip([&st_a, &st_b]) {
            c.node.node_unstage_volume(unstage_req(id, st)).await.unwrap_or_else(|e| panic!("unstage {id}: {e:?}"));
            delete(&mut c, &agent, &id).await;
        }
    });
    assert!(mounts_under(&tmp.path().join("kubelet")).is_empty(), "left mounted: {:?}", mounts_under(&tmp.path().join("kubelet")));
}
