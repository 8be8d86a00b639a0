//! Encryption at rest (`drivelet.io/encryption: fscrypt`) on real loop drives:
//!
//! - a marker written through an encrypted volume (file contents and file name) is
//!   found 0 times in the whole drive image while staged, after unstage and after
//!   delete; the partition's first KiB holds the wrapped key, and after DeleteVolume no
//!   copy of it is left on the drive or in the state dir;
//! - a restarted agent opens the volume with the Secret's key and refuses it without
//!   one, or with another (naming the fingerprint it needs); a rotation (`key` new,
//!   `previous-key` old) opens it and rewraps, after which the old key alone is refused;
//! - block and xfs volumes of an encrypting class are refused in words; a clone or a
//!   restore of an encrypted volume is encrypted under a key of its own (its files
//!   re-encrypted), a snapshot keeps its volume's key, a plaintext copy of an encrypted
//!   volume is refused, and a plain volume cloned into an encrypting class is encrypted;
//! - an encrypted volume grown while unstaged, one grown by a move elsewhere on its
//!   drive, and one evacuated to another drive, read their data back; the place or
//!   drive they left keeps no copy of the key.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use drivelet::grpc::proto::csi;
use tonic::Code;

const KEY_A: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
const KEY_B: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";
const MARKER: &str = "DRIVELET-TENANT-MARKER-7Q";
const MARKER_NAME: &str = "DRIVELET-SECRET-FILENAME-9Z";

fn encrypted_req(name: &str, bytes: u64, cap: csi::VolumeCapability) -> csi::CreateVolumeRequest {
    vol_req(name, bytes as i64, 0, vec![cap], &[("drivelet.io/encryption", "fscrypt")])
}

fn secrets(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn stage_with(id: &str, staging: &Path, keys: &[(&str, &str)]) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest { secrets: secrets(keys), ..stage_req(id, staging, mount_cap("ext4")) }
}

/// How many times `needle` (no newline in it) occurs in the file at `path`: grep's
/// fixed-string search over the raw bytes (a sparse 1 GiB image in a second).
fn count_in(path: &Path, needle: &[u8]) -> usize {
    assert!(!needle.contains(&b'\n') && !needle.is_empty(), "a needle grep can take");
    let pat = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(pat.path(), needle).unwrap();
    let out = Command::new("grep")
        .env("LC_ALL", "C")
        .args(["-a", "-o", "-F", "-f"])
        .arg(pat.path())
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("grep: {e}"));
    assert!(out.status.code().is_some_and(|c| c <= 1), "grep {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    out.stdout.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count()
}

/// Every occurrence of the marker and its file name in the drive's image (flushed).
fn markers_on(drive: &LoopDrive) -> usize {
    sh("sync", &[]);
    count_in(&drive.file, MARKER.as_bytes()) + count_in(&drive.file, MARKER_NAME.as_bytes())
}

fn first_kib(drive: &LoopDrive, start: u64) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    sh("sync", &[]);
    let mut b = vec![0u8; 1024];
    std::fs::File::open(&drive.file).unwrap().read_exact_at(&mut b, start).unwrap();
    b
}

fn write_marker(target: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(target.join(MARKER_NAME)).unwrap();
    for _ in 0..4096 {
        f.write_all(MARKER.as_bytes()).unwrap();
    }
    f.sync_all().unwrap();
    sh("sync", &["-f", target.to_str().unwrap()]);
}

fn read_marker(target: &Path) -> bool {
    std::fs::read_to_string(target.join(MARKER_NAME)).is_ok_and(|s| s.starts_with(MARKER) && s.len() == MARKER.len() * 4096)
}

fn ctl(agent: &Agent, args: &[&str]) -> (bool, String) {
    let out = Command::new(bin()).args(["ctl", "--socket", agent.admin_socket.to_str().unwrap()]).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

struct Bed {
    tmp: tempfile::TempDir,
    agent: Agent,
    drives: Vec<LoopDrive>,
    _unmount: Unmounter,
}

impl Bed {
    fn new(drives: usize) -> Bed {
        require_host();
        assert!(
            Path::new("/sys/fs/ext4/features/encryption").exists(),
            "this kernel's ext4 cannot encrypt (/sys/fs/ext4/features/encryption is absent): encryption cannot be tested here"
        );
        let tmp = short_tempdir();
        let drives = (0..drives).map(|i| LoopDrive::new(tmp.path(), &format!("e{i}.img"), GIB)).collect();
        sh("udevadm", &["settle"]);
        // Under the seccomp filter the DaemonSet runs with: the key ioctls, the
        // encrypting mkfs and the copy into an encrypted volume (cp -a in a mount
        // namespace of its own) must all pass it.
        let opts = AgentOpts { extra_toml: "[security]\nseccomp = \"enforce\"\n".into(), ..AgentOpts::default() };
        let agent = Agent::start(tmp.path(), opts);
        let unmount = Unmounter(tmp.path().join("kubelet"));
        Bed { agent, drives, _unmount: unmount, tmp }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join("kubelet").join(rel)
    }

    fn stage(&self, id: &str, keys: &[(&str, &str)]) -> Result<PathBuf, tonic::Status> {
        let (staging, target) = (self.path("plugins/stage"), self.path("pods/p/mount"));
        rt().block_on(async {
            let mut c = Csi::connect(&self.agent).await;
            c.node.node_stage_volume(stage_with(id, &staging, keys)).await?;
            c.node.node_publish_volume(publish_req(id, &staging, &target, mount_cap("ext4"), false)).await?;
            Ok(target)
        })
    }

    fn unstage(&self, id: &str) {
        let (staging, target) = (self.path("plugins/stage"), self.path("pods/p/mount"));
        rt().block_on(async {
            let mut c = Csi::connect(&self.agent).await;
            c.node.node_unpublish_volume(unpublish_req(id, &target)).await.expect("unpublish");
            c.node.node_unstage_volume(unstage_req(id, &staging)).await.expect("unstage");
        });
    }

    fn create(&self, name: &str, bytes: u64) -> String {
        rt().block_on(async {
            let mut c = Csi::connect(&self.agent).await;
            c.ctrl.create_volume(encrypted_req(name, bytes, mount_cap("ext4"))).await.expect("create").into_inner().volume.unwrap().volume_id
        })
    }

    fn delete(&self, id: &str) {
        rt().block_on(async {
            let mut c = Csi::connect(&self.agent).await;
            c.ctrl.delete_volume(del_req(id)).await.expect("delete");
        });
    }

    /// The drive id, start and size of volume `id`.
    fn extent(&self, id: &str) -> (String, u64, u64) {
        let vols = self.agent.ctl_volumes();
        let v = vols.as_array().unwrap().iter().find(|v| v["id"] == id).unwrap_or_else(|| panic!("volume {id} listed: {vols}"));
        (v["drive_id"].as_str().unwrap().to_string(), v["start"].as_u64().unwrap(), v["size"].as_u64().unwrap())
    }

    /// Which of the bed's drives `drive_id` is.
    fn drive(&self, drive_id: &str) -> usize {
        let ds = self.agent.ctl_drives();
        let path = ds.as_array().unwrap().iter().find(|d| d["id"] == drive_id).map(|d| d["path"].as_str().unwrap().to_string()).expect("drive listed");
        self.drives.iter().position(|d| d.dev.to_str() == Some(path.as_str())).expect("one of the bed's drives")
    }
}

#[test]
fn an_encrypted_volume_leaves_only_ciphertext_on_its_drive_and_delete_destroys_its_key() {
    let mut bed = Bed::new(1);
    let id = bed.create("pvc-enc-marker", 64 * MIB);
    let (drive_id, start, _) = bed.extent(&id);
    let di = bed.drive(&drive_id);

    let target = bed.stage(&id, &[("key", KEY_A)]).expect("stage with the Secret's key");
    write_marker(&target);
    assert!(read_marker(&target), "the tenant reads its file back");
    assert_eq!(markers_on(&bed.drives[di]), 0, "staged: the marker and its file name are on the drive only as ciphertext");
    let header = first_kib(&bed.drives[di], start);
    assert_eq!(&header[..8], b"DRVLKEY1", "the wrapped key is in the partition's first KiB");

    bed.unstage(&id);
    assert_eq!(markers_on(&bed.drives[di]), 0, "unstaged: still ciphertext only");
    // The unstaged filesystem mounted by hand shows names encrypted, contents unreadable.
    let look = bed.tmp.path().join("look");
    std::fs::create_dir_all(&look).unwrap();
    let dev = drivelet::disk::blkpg::ensure_kernel_partition(&bed.drives[di].dev, start, 64 * MIB).unwrap().devnode;
    sh("mount", &["-o", "ro", dev.to_str().unwrap(), look.to_str().unwrap()]);
    let names: Vec<String> = std::fs::read_dir(look.join("data")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect();
    sh("umount", &[look.to_str().unwrap()]);
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(!names[0].contains(MARKER_NAME), "without the key the file name is ciphertext: {names:?}");

    // A restarted agent: refused without a key and with another, opened with the right one.
    assert_eq!(bed.agent.stop(), 0, "the agent stopped cleanly");
    bed.agent.spawn();
    let e = bed.stage(&id, &[]).expect_err("no key-encryption key");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("no key-encryption key was given") && e.message().contains("node-stage-secret-name"), "{}", e.message());
    let e = bed.stage(&id, &[("key", KEY_B)]).expect_err("another key-encryption key");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("fingerprint") && !e.message().contains(KEY_B), "{}", e.message());
    let e = bed.stage(&id, &[("key", "c2hvcnQ=")]).expect_err("a malformed key");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(!bed.agent.logs().contains(KEY_A) && !bed.agent.logs().contains(KEY_B), "no key-encryption key in the log");

    // Rotation: the new key with the old as previous opens and rewraps; then the old
    // key alone no longer opens it, the new one does.
    let target = bed.stage(&id, &[("key", KEY_B), ("previous-key", KEY_A)]).expect("stage during a rotation");
    assert!(read_marker(&target), "read back after a restart and a rotation");
    bed.unstage(&id);
    let e = bed.stage(&id, &[("key", KEY_A)]).expect_err("the retired key-encryption key");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let target = bed.stage(&id, &[("key", KEY_B)]).expect("the current key-encryption key alone");
    assert!(read_marker(&target));
    bed.unstage(&id);
    // 16 bytes of the wrapped key (a run without a newline, for grep).
    let header = first_kib(&bed.drives[di], start);
    let at = (64..128).find(|&i| !header[i..i + 16].contains(&b'\n')).expect("16 bytes of the wrapped key without a newline");
    let wrapped = header[at..at + 16].to_vec();

    // Delete: the key is gone from the partition and from everywhere drivelet keeps
    // anything; the marker is nowhere.
    bed.delete(&id);
    assert!(first_kib(&bed.drives[di], start).iter().all(|b| *b == 0), "the wrapped key is erased");
    assert_eq!(count_in(&bed.drives[di].file, &wrapped), 0, "no copy of the wrapped key on the drive");
    assert_eq!(count_in(&bed.drives[di].file, b"DRVLKEY1"), 0, "no key header on the drive");
    for f in walk(&bed.tmp.path().join("state")) {
        assert_eq!(count_in(&f, &wrapped), 0, "no copy of the wrapped key in {}", f.display());
    }
    assert_eq!(markers_on(&bed.drives[di]), 0, "deleted: no marker");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.is_file() {
            out.push(p);
        }
    }
    out
}

#[test]
fn block_and_xfs_volumes_of_an_encrypting_class_are_refused_in_words() {
    let bed = Bed::new(1);
    rt().block_on(async {
        let mut c = Csi::connect(&bed.agent).await;
        for (cap, words) in [(block_cap(), "a block volume cannot be encrypted"), (mount_cap("xfs"), "an xfs filesystem cannot be encrypted")] {
            let e = c.ctrl.create_volume(encrypted_req("pvc-enc-refused", 64 * MIB, cap)).await.expect_err("refused");
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            assert!(e.message().contains(words) && e.message().contains("ext4"), "{}", e.message());
        }
        let e = c.ctrl.create_volume(vol_req("pvc-enc-bad", 64 << 20, 0, vec![mount_cap("ext4")], &[("drivelet.io/encryption", "luks")])).await.expect_err("unknown");
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("fscrypt"), "{}", e.message());
    });
    assert!(bed.agent.ctl_volumes().as_array().unwrap().is_empty(), "nothing was made");
}

/// The volume key in the header at `start` of `drive` (bound to `owner`), opened with
/// the test's key-encryption key `kek`.
fn volume_key_at(drive: &LoopDrive, start: u64, owner: &str, kek: &str) -> Vec<u8> {
    use drivelet::disk::volume_key as vk;
    let keks = vk::Keks::from_secrets(&secrets(&[("key", kek)])).unwrap().unwrap();
    match vk::state_of(&first_kib(drive, start), owner.parse().unwrap()) {
        vk::KeyState::Key(h) => vk::unwrap(&h, &keks).expect("the header opens with the key-encryption key").0.to_vec(),
        other => panic!("no key header at byte {start}: {other:?}"),
    }
}

#[test]
fn clones_and_restores_of_an_encrypted_volume_are_encrypted_under_keys_of_their_own() {
    let bed = Bed::new(1);
    let drive = &bed.drives[0];
    let id = bed.create("pvc-enc-src", 64 * MIB);
    let target = bed.stage(&id, &[("key", KEY_A)]).expect("stage");
    write_marker(&target);
    bed.unstage(&id);
    let enc = [("drivelet.io/encryption", "fscrypt")];
    let with_secrets = |mut r: csi::CreateVolumeRequest, keys: &[(&str, &str)]| {
        r.parameters.extend(enc.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        r.secrets = secrets(keys);
        r
    };
    let (clone, restored, snap) = rt().block_on(async {
        let mut c = Csi::connect(&bed.agent).await;
        // Into a plain class: refused, nothing made.
        let e = c.ctrl.create_volume(clone_req("pvc-enc-plain", 64 * MIB, 0, mount_cap("ext4"), &id)).await.expect_err("a plaintext copy");
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("a copy of it is encrypted too") && e.message().contains("drivelet.io/encryption: fscrypt"), "{}", e.message());
        // Without the provisioner's Secret: refused, saying which.
        let e = c.ctrl.create_volume(with_secrets(clone_req("pvc-enc-nokey", 64 * MIB, 0, mount_cap("ext4"), &id), &[])).await.expect_err("no key");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("provisioner-secret-name"), "{}", e.message());
        let clone = c.ctrl.create_volume(with_secrets(clone_req("pvc-enc-clone", 64 * MIB, 0, mount_cap("ext4"), &id), &[("key", KEY_A)])).await.expect("clone");
        let snap = c.ctrl.create_snapshot(snapshot_req("snap-enc", &id, &[])).await.expect("snapshot").into_inner().snapshot.unwrap();
        c.ctrl.delete_volume(del_req(&id)).await.expect("the source deleted");
        let restored = c
            .ctrl
            .create_volume(with_secrets(restore_req("pvc-enc-restored", 64 * MIB, 0, mount_cap("ext4"), &snap.snapshot_id), &[("key", KEY_B), ("previous-key", KEY_A)]))
            .await
            .expect("restore");
        (clone.into_inner().volume.unwrap().volume_id, restored.into_inner().volume.unwrap().volume_id, snap.snapshot_id)
    });
    assert_eq!(bed.agent.ctl_volumes().as_array().unwrap().iter().filter(|v| v["name"].as_str().is_some_and(|n| n.contains("plain") || n.contains("nokey"))).count(), 0, "no refused copy was made");
    let (_, clone_at, _) = bed.extent(&clone);
    let (_, restored_at, _) = bed.extent(&restored);
    let snap_at = gpt_entries(&drive.dev).into_iter().find(|e| e.uuid.eq_ignore_ascii_case(&snap)).expect("the snapshot's partition").start;
    // Restored after a rotation (key B, previous key A): the snapshot was rewrapped with
    // B, the restored volume's key is wrapped with B.
    let snap_key = volume_key_at(drive, snap_at, &id, KEY_B);
    let clone_key = volume_key_at(drive, clone_at, &clone, KEY_A);
    let restored_key = volume_key_at(drive, restored_at, &restored, KEY_B);
    assert_ne!(clone_key, snap_key, "the clone has a key of its own");
    assert_ne!(restored_key, snap_key, "the restored volume has a key of its own");
    assert_ne!(clone_key, restored_key);
    for (v, kek) in [(&clone, KEY_A), (&restored, KEY_B)] {
        let target = bed.stage(v, &[("key", kek)]).expect("stage the copy");
        assert!(read_marker(&target), "the copy holds the source's file");
        bed.unstage(v);
    }
    assert_eq!(markers_on(drive), 0, "every copy is ciphertext on the drive");

    // A plain volume cloned into an encrypting class: encrypted from then on.
    let plain = rt().block_on(async {
        let mut c = Csi::connect(&bed.agent).await;
        c.ctrl.create_volume(create_req("pvc-plain-src", 64 * MIB, mount_cap("ext4"))).await.expect("create").into_inner().volume.unwrap().volume_id
    });
    let target = bed.stage(&plain, &[]).expect("stage the plain volume");
    std::fs::write(target.join("plain.txt"), "a plain file").unwrap();
    bed.unstage(&plain);
    let enc_clone = rt().block_on(async {
        let mut c = Csi::connect(&bed.agent).await;
        let r = with_secrets(clone_req("pvc-plain-to-enc", 64 * MIB, 0, mount_cap("ext4"), &plain), &[("key", KEY_B)]);
        c.ctrl.create_volume(r).await.expect("clone into an encrypting class").into_inner().volume.unwrap().volume_id
    });
    let (_, at, _) = bed.extent(&enc_clone);
    assert_eq!(&first_kib(drive, at)[..8], b"DRVLKEY1", "the clone carries a key");
    let target = bed.stage(&enc_clone, &[("key", KEY_B)]).expect("stage the encrypted clone");
    assert_eq!(std::fs::read_to_string(target.join("plain.txt")).unwrap(), "a plain file");
    assert!(!target.join("lost+found").exists(), "the source's lost+found is not copied into the data directory");
    bed.unstage(&enc_clone);
}

#[test]
fn an_encrypted_volume_grown_offline_and_one_evacuated_read_their_data_back() {
    let bed = Bed::new(2);
    let id = bed.create("pvc-enc-moves", 64 * MIB);
    let target = bed.stage(&id, &[("key", KEY_A)]).expect("stage");
    write_marker(&target);
    bed.unstage(&id);

    // Grown while unstaged: the next stage grows the filesystem and reads the data.
    rt().block_on(async {
        let mut c = Csi::connect(&bed.agent).await;
        c.ctrl.controller_expand_volume(expand_req(&id, 128 * MIB, 0)).await.expect("expand");
    });
    let target = bed.stage(&id, &[("key", KEY_A)]).expect("stage the grown volume");
    assert!(read_marker(&target), "read back after growth");
    let st = nix::sys::statvfs::statvfs(&target).unwrap();
    assert!(st.blocks() as u64 * st.fragment_size() as u64 > 100 * MIB, "the filesystem grew");
    bed.unstage(&id);

    // Evacuated to the other drive: same key, data read back; the old drive holds no
    // copy of the key.
    let (src, start, _) = bed.extent(&id);
    let old = &bed.drives[bed.drive(&src)];
    let (ok, out) = ctl(&bed.agent, &["drive", "evacuate", &src]);
    assert!(ok, "{out}");
    let t0 = std::time::Instant::now();
    while bed.extent(&id).0 == src {
        assert!(t0.elapsed().as_secs() < 60, "the volume moved within 60 s; log:\n{}", bed.agent.log_tail(30));
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let target = bed.stage(&id, &[("key", KEY_A)]).expect("stage the moved volume");
    assert!(read_marker(&target), "read back after the move");
    bed.unstage(&id);
    assert!(first_kib(old, start).iter().all(|b| *b == 0), "the old partition's key header is erased");
    assert_eq!(count_in(&old.file, b"DRVLKEY1"), 0, "no key header left on the old drive");
    assert_eq!(markers_on(old) + bed.drives.iter().map(markers_on).sum::<usize>(), 0, "no marker anywhere");
    bed.delete(&id);
}

#[test]
fn an_encrypted_volume_grown_by_a_move_on_its_own_drive_keeps_its_key_there_only() {
    let bed = Bed::new(1);
    let drive = &bed.drives[0];
    let id = bed.create("pvc-enc-grow1", 64 * MIB);
    let next = bed.create("pvc-enc-grow1-next", 64 * MIB);
    let (_, start, size) = bed.extent(&id);
    assert_eq!(bed.extent(&next).1, start + size, "the next volume follows it right after it");
    let target = bed.stage(&id, &[("key", KEY_A)]).expect("stage");
    write_marker(&target);
    bed.unstage(&id);
    let key = volume_key_at(drive, start, &id, KEY_A);
    sh("sync", &[]);
    let headers = count_in(&drive.file, b"DRVLKEY1");
    // No room after it: moved elsewhere on its drive, then grown.
    rt().block_on(async {
        let mut c = Csi::connect(&bed.agent).await;
        c.ctrl.controller_expand_volume(expand_req(&id, 200 * MIB, 0)).await.expect("grown by a move on its drive");
    });
    let (_, new_start, new_size) = bed.extent(&id);
    assert_eq!(new_size, 200 * MIB);
    assert_ne!(new_start, start, "at a new place");
    assert_eq!(volume_key_at(drive, new_start, &id, KEY_A), key, "the same key, at the new place");
    assert!(first_kib(drive, start).iter().all(|b| *b == 0), "the old place's key header is erased");
    let target = bed.stage(&id, &[("key", KEY_A)]).expect("stage the moved volume");
    assert!(read_marker(&target), "read back after the move");
    bed.unstage(&id);
    // As many key headers as before: the copy's, none left where the volume was.
    sh("sync", &[]);
    assert_eq!(count_in(&drive.file, b"DRVLKEY1"), headers, "no key header left behind");
    assert_eq!(markers_on(drive), 0, "no plain marker anywhere");
    bed.delete(&id);
    bed.delete(&next);
}
