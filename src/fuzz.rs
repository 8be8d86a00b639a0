//! Fuzz targets: one function per parser of bytes drivelet did not write (or wrote, but
//! reads back from a disk anyone may have written to), each taking the raw input a fuzz
//! engine made. The engine is `tests/fuzz` (stable Rust, a mutation engine over a seed
//! corpus); docs/testing.md lists every target and what it covers.
//!
//! Rules every target keeps:
//! - it calls the same functions the agent calls on the same bytes (the GPT reader and
//!   writer on an image file, the note and journal decoders, the text parsers), never a
//!   copy of them;
//! - a target panics only when a property drivelet promises is broken (a decoded record
//!   that does not encode back to itself, a refused disk that changed); the engine
//!   counts any panic, a hang or an allocation beyond its bound as a failure;
//! - nothing runs a tool: blkid's answer on an image is a stand-in chosen by the input
//!   ([`crate::disk::fs::set_probe_stand_in`]), so a target judges thousands of inputs a
//!   second and needs no root.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::disk::{clean, gpt, note, snapshot_note, volume_key};

/// Every target by name, as the engine and its corpus directories name them.
pub const TARGETS: &[(&str, fn(&[u8]))] = &[
    ("gpt", gpt_image),
    ("mbr", mbr),
    ("note", disk_note),
    ("journal", journal),
    ("snapshot_note", snapshot_note),
    ("key_header", key_header),
    ("mountinfo", mountinfo),
    ("udev", udev),
    ("smartctl", smartctl),
    ("blkid", blkid),
    ("dumpe2fs", dumpe2fs),
    ("config", config),
    ("admin_request", admin_request),
    ("migration_pv", migration_pv),
    ("store_record", store_record),
    ("freeze_record", freeze_record),
];

fn text(input: &[u8]) -> String {
    String::from_utf8_lossy(input).into_owned()
}

fn le32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4).map_or(0, |s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn le64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8).and_then(|s| s.try_into().ok()).map_or(0, u64::from_le_bytes)
}

// ---- images: the GPT reader and writer, the note and journal in the reserved area ----

/// Largest image a `gpt` input may describe (sparse: only the chunks it names are
/// written).
pub const MAX_IMAGE: u64 = 1 << 40;

/// A `gpt` input, decoded: a disk image described by its size and the chunks of it that
/// are not zero.
///
/// Layout: the size (u64 LE, modulo [`MAX_IMAGE`]); a flags byte (bit 0: 4 KiB sectors,
/// else 512; bit 1: repair the checksums of GPT headers and entry arrays, notes and
/// journals after the chunks are written, so a mutation reaches what the checksums
/// guard; bits 2-3: what the blkid stand-in answers: nothing, a DOS table, an ext4
/// filesystem, a GPT); then chunks, each an offset (u64 LE; bit 63 set: counted back
/// from the end), a length (u16 LE) and that many bytes. A chunk cut short by the end of
/// the input keeps what is there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Bytes of the image.
    pub size: u64,
    /// The flags byte.
    pub flags: u8,
    /// `(offset from the start, bytes)`.
    pub chunks: Vec<(u64, Vec<u8>)>,
}

/// Bit 63 of a chunk's offset: counted back from the end of the image.
const FROM_END: u64 = 1 << 63;

impl Image {
    /// Decodes a `gpt` input.
    pub fn decode(input: &[u8]) -> Image {
        let size = le64(input, 0) % MAX_IMAGE;
        let flags = input.get(8).copied().unwrap_or(0);
        let mut chunks = Vec::new();
        let mut at = 9;
        while at + 10 <= input.len() {
            let off = le64(input, at);
            let len = usize::from(u16::from_le_bytes([input[at + 8], input[at + 9]]));
            let data = &input[at + 10..(at + 10 + len).min(input.len())];
            let start = if off & FROM_END != 0 { size.saturating_sub(off & !FROM_END) } else { off };
            chunks.push((start, data.to_vec()));
            at += 10 + len;
        }
        Image { size, flags, chunks }
    }

    /// Encodes an image whose bytes are `bytes`: its non-zero 512-byte blocks as chunks,
    /// those in the second half counted from the end (so a backup GPT stays at the end
    /// when a mutation changes the size).
    pub fn encode_bytes(bytes: &[u8], flags: u8) -> Vec<u8> {
        let size = bytes.len() as u64;
        let mut out = size.to_le_bytes().to_vec();
        out.push(flags);
        let blocks: Vec<usize> = (0..bytes.len().div_ceil(512)).filter(|b| bytes[b * 512..((b + 1) * 512).min(bytes.len())].iter().any(|&x| x != 0)).collect();
        let mut i = 0;
        while i < blocks.len() {
            let mut j = i;
            while j + 1 < blocks.len() && blocks[j + 1] == blocks[j] + 1 && (blocks[j + 1] - blocks[i] + 1) * 512 <= 65024 {
                j += 1;
            }
            let (s, e) = (blocks[i] * 512, ((blocks[j] + 1) * 512).min(bytes.len()));
            let off = if (s as u64) < size / 2 { s as u64 } else { (size - s as u64) | FROM_END };
            out.extend_from_slice(&off.to_le_bytes());
            out.extend_from_slice(&((e - s) as u16).to_le_bytes());
            out.extend_from_slice(&bytes[s..e]);
            i = j + 1;
        }
        out
    }

    /// The logical block size the input asks for.
    pub fn sector(&self) -> u64 {
        if self.flags & 1 != 0 {
            4096
        } else {
            512
        }
    }

    /// What the blkid stand-in answers for this image.
    fn probe(&self) -> Option<crate::disk::fs::Probed> {
        use crate::disk::fs::Probed;
        match (self.flags >> 2) & 3 {
            0 => None,
            1 => Some(Probed { pt_type: Some("dos".into()), ..Default::default() }),
            2 => Some(Probed { fs_type: Some("ext4".into()), usage: Some("filesystem".into()), version: Some("1.0".into()), ..Default::default() }),
            _ => Some(Probed { pt_type: Some("gpt".into()), ..Default::default() }),
        }
    }

    /// Writes the image to `path` (replacing what was there), chunks past its end cut.
    pub fn write_to(&self, path: &Path) -> std::io::Result<File> {
        let f = File::options().read(true).write(true).create(true).truncate(true).open(path)?;
        f.set_len(self.size)?;
        for (start, data) in &self.chunks {
            if *start >= self.size {
                continue;
            }
            let n = data.len().min((self.size - start) as usize);
            f.write_all_at(&data[..n], *start)?;
        }
        if self.flags & 2 != 0 {
            repair_checksums(&f, self.size)?;
        }
        f.set_modified(std::time::UNIX_EPOCH)?;
        Ok(f)
    }
}

/// Rewrites every checksum on an image that guards something that is there: the header
/// and entry-array CRCs of each GPT header (primary and backup, both sector sizes), and
/// the CRCs of drivelet's notes and journals in the reserved area. Bounded like the
/// readers: an entry array over 1 MiB, or a length a slot cannot hold, is left alone.
pub fn repair_checksums(f: &File, size: u64) -> std::io::Result<()> {
    let read = |at: u64, len: usize| -> Option<Vec<u8>> {
        let mut b = vec![0u8; len];
        (at.checked_add(len as u64)? <= size).then_some(())?;
        f.read_exact_at(&mut b, at).ok().map(|_| b)
    };
    for sector in [512u64, 4096] {
        if size < 3 * sector {
            continue;
        }
        for lba in [1, size / sector - 1] {
            let Some(mut h) = read(lba * sector, 92) else { continue };
            if &h[..8] != b"EFI PART" {
                continue;
            }
            let (start, count, entry) = (le64(&h, 72), u64::from(le32(&h, 80)), u64::from(le32(&h, 84)));
            let array = count.checked_mul(entry).filter(|&n| n <= 1 << 20).and_then(|n| read(start.checked_mul(sector)?, n as usize));
            if let Some(array) = array {
                h[88..92].copy_from_slice(&clean::crc32(&array).to_le_bytes());
            }
            h[16..20].fill(0);
            let crc = clean::crc32(&h);
            h[16..20].copy_from_slice(&crc.to_le_bytes());
            f.write_all_at(&h, lba * sector)?;
        }
    }
    // Notes: a CRC over header and body; journals: over header and extents. Both keep
    // their length at byte 12 and their CRC at byte 40.
    let slots = note::SLOTS.iter().map(|&at| (at, &b"DRVLNOTE"[..], 1u64)).chain(clean::SLOTS.iter().map(|&at| (at, &b"DRVLDRTY"[..], 16u64)));
    for (at, magic, unit) in slots {
        let Some(head) = read(at, 64) else { continue };
        if &head[..8] != magic {
            continue;
        }
        let used = 64 + u64::from(le32(&head, 12)) * unit;
        if used > 256 << 10 {
            continue;
        }
        let Some(mut b) = read(at, used as usize) else { continue };
        b[40..44].fill(0);
        let crc = clean::crc32(&b);
        f.write_all_at(&crc.to_le_bytes(), at + 40)?;
    }
    Ok(())
}

/// A scratch image file of this thread: under `/dev/shm` where there is one (no disk
/// writes), else the temp dir.
fn scratch_image() -> PathBuf {
    thread_local! {
        static PATH: PathBuf = {
            let shm = Path::new("/dev/shm");
            let dir = if shm.is_dir() && tempfile_writable(shm) { shm.to_path_buf() } else { std::env::temp_dir() };
            let id = format!("{:?}", std::thread::current().id()).chars().filter(char::is_ascii_digit).collect::<String>();
            dir.join(format!("drivelet-fuzz-{}-{id}.img", std::process::id()))
        };
    }
    PATH.with(Clone::clone)
}

fn tempfile_writable(dir: &Path) -> bool {
    let probe = dir.join(format!("drivelet-fuzz-probe-{}", std::process::id()));
    let ok = File::create(&probe).is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}

/// Removes this thread's scratch image (the engine calls it when a target is done).
pub fn remove_scratch() {
    let _ = std::fs::remove_file(scratch_image());
}

/// Whether anything was written to the image since [`Image::write_to`]: that set its
/// modification time to the epoch, and every write(2) to it sets the time to now (a
/// content digest of the first and last MiB would cost more than the whole target).
fn written_since_made(f: &File, img: &Image) -> bool {
    let md = f.metadata().ok();
    md.as_ref().and_then(|m| m.modified().ok()) != Some(std::time::UNIX_EPOCH) || md.map(|m| m.len()) != Some(img.size)
}

/// Target `gpt`: a disk image ([`Image`]) read by the GPT reader (`examine`,
/// `read_table`, `read_dirty`, `read_note`), as the drive inventory and the writer
/// read a disk. A disk judged foreign or unreadable must refuse every write and keep
/// every byte; a drivelet disk must read back as drivelet's after the writer added a
/// partition to it.
pub fn gpt_image(input: &[u8]) {
    let img = Image::decode(input);
    let path = scratch_image();
    let Ok(file) = img.write_to(&path) else { return };
    let sector = img.sector();
    crate::disk::fs::set_probe_stand_in(Some(img.probe()));
    let _ = gpt::read_table(&path, sector);
    let _ = gpt::read_note(&path);
    let _ = gpt::read_dirty(&path, sector);
    let other = if sector == 512 { 4096 } else { 512 };
    let _ = gpt::examine(&path, other);
    match gpt::examine(&path, sector) {
        Ok(gpt::Contents::Drivelet(t)) => drivelet_table(&path, sector, &img, &t),
        Ok(gpt::Contents::Blank) => {}
        found => {
            // Foreign or unreadable: nothing may be written.
            assert!(!written_since_made(&file, &img), "the image changed before anything was asked to write");
            let guid = gpt::volume_partition_guid("fuzz");
            let add = gpt::add_partition(&path, sector, guid, "drivelet:fuzz", gpt::ALIGN, gpt::ALIGN);
            assert!(add.is_err(), "a disk examined as {found:?} took a partition");
            let _ = gpt::remove_partition(&path, sector, guid);
            let _ = gpt::write_note(&path, sector, false, |_| fuzz_note());
            let _ = gpt::mark_clean(&path, sector, gpt::ALIGN, gpt::ALIGN, None);
            assert!(!written_since_made(&file, &img), "a disk examined as {found:?} was written to");
        }
    }
    crate::disk::fs::set_probe_stand_in(None);
}

fn fuzz_note() -> note::DiskNote {
    note::DiskNote { owner: crate::words::Owner { cluster: "fuzz".into(), node: "fuzz".into() }, adopted_from: None, volumes: Vec::new() }
}

/// A drivelet table: its note's verdict and the dirty space as the inventory and the
/// cleaner compute them, then a partition added where the table has room, and read back.
fn drivelet_table(path: &Path, sector: u64, img: &Image, t: &gpt::GptTable) {
    let me = crate::words::Owner { cluster: "fuzz".into(), node: "fuzz".into() };
    let volumes = t.partitions.iter().filter(|p| p.is_drivelet()).count();
    let _ = note::verdict(&t.note, &me, volumes, false);
    if let note::NoteState::Note(n) = &t.note {
        let _ = note::held(n);
    }
    let used: Vec<(u64, u64)> = t.partitions.iter().map(|p| (p.start, p.size)).collect();
    let free = gpt::free_extents(img.size, sector, &used);
    let _ = clean::dirty_of(None, &free);
    let Some(&(start, _)) = free.first() else { return };
    let guid = gpt::volume_partition_guid("fuzz");
    if gpt::add_partition(path, sector, guid, "drivelet:fuzz", start, gpt::ALIGN).is_ok() {
        match gpt::examine(path, sector) {
            Ok(gpt::Contents::Drivelet(after)) => {
                assert!(
                    after.partitions.iter().any(|p| p.guid == guid && p.start == start),
                    "the partition just added at {start} is not in the table read back: before {:?}, after {:?}, entries {}",
                    t.partitions.iter().map(|p| (p.guid, p.start, p.size)).collect::<Vec<_>>(),
                    after.partitions.iter().map(|p| (p.guid, p.start, p.size)).collect::<Vec<_>>(),
                    t.partitions.len()
                )
            }
            other => panic!("a drivelet table the writer changed reads back as {other:?}"),
        }
        let _ = gpt::remove_partition(path, sector, guid);
        let _ = gpt::read_dirty(path, sector);
    }
}

/// Target `mbr`: an MBR and the sectors after it (the input, 512 bytes a sector),
/// counted as the writer counts a DOS table's partitions: every chain of extended boot
/// records ends, however it loops.
pub fn mbr(input: &[u8]) {
    let lba0 = input.get(..512).unwrap_or(input);
    let sector = |lba: u64| {
        let at = usize::try_from(lba.checked_mul(512)?).ok()?;
        input.get(at..at.checked_add(512)?).map(<[u8]>::to_vec)
    };
    let n = crate::disk::signature::count_mbr_partitions(lba0, sector);
    assert!(n <= 4 + 4 * 256, "{n} partitions counted in one MBR");
    let _ = crate::disk::signature::describe_table("dos", Some(n));
}

/// The flag of slot inputs (`note`, `journal`, `snapshot_note`): the first byte's bit 0
/// asks for the checksum to be repaired before decoding, the rest is the slot.
fn slot_input(input: &[u8]) -> (bool, Vec<u8>) {
    match input.split_first() {
        Some((flag, rest)) => (flag & 1 != 0, rest.to_vec()),
        None => (false, Vec::new()),
    }
}

/// Target `key_header`: an encrypted volume's first KiB (see [`slot_input`]; with the
/// flag, each slot's CRC is made right) read as a stage reads it; a valid header encodes
/// back to itself and opening it with a KEK it was not wrapped by fails in words.
pub fn key_header(input: &[u8]) {
    let (repair, mut b) = slot_input(input);
    b.truncate(volume_key::HEADER_LEN);
    if repair {
        for slot in b.chunks_mut(512).filter(|s| s.len() >= 148) {
            let crc = clean::crc32(&slot[..144]);
            slot[144..148].copy_from_slice(&crc.to_le_bytes());
        }
    }
    let volume = uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
    for slot in b.chunks(512) {
        if let volume_key::Slot::Valid(h) = volume_key::decode(slot) {
            assert_eq!(volume_key::decode(&volume_key::encode(&h)), volume_key::Slot::Valid(h), "a key header does not decode to itself");
        }
    }
    if let volume_key::KeyState::Key(h) = volume_key::state_of(&b, volume) {
        let keks = volume_key::Keks { current: volume_key::Kek::new([0x5a; 32]), previous: vec![] };
        if let Err(e) = volume_key::unwrap(&h, &keks) {
            assert!(!e.to_string().is_empty());
        }
    }
}

/// Target `note`: one note slot's bytes (see [`slot_input`]) decoded as the inventory
/// decodes a disk's note; a valid note encodes back to the same note.
pub fn disk_note(input: &[u8]) {
    let (repair, mut b) = slot_input(input);
    if repair && b.len() >= 64 {
        let used = 64 + le32(&b, 12) as usize;
        if used <= b.len() {
            b[40..44].fill(0);
            let crc = clean::crc32(&b[..used]);
            b[40..44].copy_from_slice(&crc.to_le_bytes());
        }
    }
    let slot = note::decode(&b);
    if let note::Slot::Valid { seq, disk_guid, note: n } = &slot {
        let again = note::encode(n, *seq, *disk_guid).expect("a decoded note encodes");
        assert_eq!(note::decode(&again), slot, "a note does not decode to itself");
        let me = crate::words::Owner { cluster: "fuzz".into(), node: "fuzz".into() };
        let state = note::state_of(std::slice::from_ref(&slot), *disk_guid);
        if let note::Verdict::Elsewhere(o) = note::verdict(&state, &me, n.volumes.len(), false) {
            let _ = note::whose(&o, &me);
        }
    }
}

/// Target `journal`: one journal slot's bytes (see [`slot_input`]) decoded as the
/// cleaner decodes it; a valid journal's extents are merged and encode back.
pub fn journal(input: &[u8]) {
    let (repair, mut b) = slot_input(input);
    if repair && b.len() >= 64 {
        let used = 64usize.saturating_add((le32(&b, 12) as usize).saturating_mul(16));
        if used <= b.len() {
            b[40..44].fill(0);
            let crc = clean::crc32(&b[..used]);
            b[40..44].copy_from_slice(&crc.to_le_bytes());
        }
    }
    if let Some(j) = clean::Journal::decode(&b) {
        assert_eq!(clean::normalize(&j.dirty), j.dirty, "a decoded journal's extents are not merged");
        let again = j.encode().expect("a decoded journal encodes");
        assert_eq!(clean::Journal::decode(&again), Some(j.clone()), "a journal does not decode to itself");
        let free = [(1u64 << 20, 1u64 << 30)];
        let _ = clean::dirty_of(Some(&j.dirty), &free);
        let _ = clean::total(&j.dirty);
        let _ = clean::subtract(&j.dirty, &free);
    }
}

/// Target `snapshot_note`: a snapshot partition's note block (see [`slot_input`]; the
/// repair fixes the body's CRC), decoded as a snapshot is rebuilt from its drive.
pub fn snapshot_note(input: &[u8]) {
    let (repair, mut b) = slot_input(input);
    if repair && b.len() >= 20 {
        let len = le32(&b, 12) as usize;
        if let Some(body) = b.get(20..20usize.saturating_add(len)) {
            let crc = clean::crc32(body);
            b[16..20].copy_from_slice(&crc.to_le_bytes());
        }
    }
    if let Some(n) = snapshot_note::decode(&b) {
        if let Some(again) = snapshot_note::encode(&n) {
            assert_eq!(snapshot_note::decode(&again), Some(n), "a snapshot note does not decode to itself");
        }
    }
}

// ---- the host and its tools ----

/// Target `mountinfo`: `/proc/self/mountinfo` (and `/proc/swaps`) text, parsed and
/// turned into the host's usage as the inventory does.
pub fn mountinfo(input: &[u8]) {
    use crate::disk::mounts;
    let t = text(input);
    let entries = mounts::parse_mountinfo(&t);
    for e in &entries {
        let _ = e.kind();
    }
    let swaps = mounts::parse_swaps(&t);
    let _ = mounts::HostUsage::build(&entries, &swaps, |p| crate::disk::parse_devnum(&p.to_string_lossy().replace("/dev/", "")));
}

/// A udev property dump (`udevadm info --query=property`, `KEY=value` lines) as a probe.
fn probe_of(t: &str) -> crate::disk::udev::DiskProbe {
    use crate::disk::udev::{DiskProbe, PartitionProbe};
    let props: BTreeMap<String, String> = t.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let devname = props.get("DEVNAME").cloned().unwrap_or_default();
    let num = |k: &str| props.get(k).and_then(|v| v.parse::<u64>().ok());
    let part = PartitionProbe {
        name: format!("{}1", devname.trim_start_matches("/dev/")),
        part_uuid: props.get("ID_PART_ENTRY_UUID").cloned().unwrap_or_default().to_ascii_lowercase(),
        part_type: props.get("ID_PART_ENTRY_TYPE").cloned().unwrap_or_default().to_ascii_lowercase(),
        part_name: props.get("ID_PART_ENTRY_NAME").cloned().unwrap_or_default(),
        fs_type: props.get("ID_FS_TYPE").cloned(),
        start: num("ID_PART_ENTRY_OFFSET").unwrap_or(2048).saturating_mul(512),
        size: num("ID_PART_ENTRY_SIZE").unwrap_or(0).saturating_mul(512),
        ..Default::default()
    };
    DiskProbe {
        name: devname.trim_start_matches("/dev/").to_string(),
        devnode: PathBuf::from(&devname),
        devnum: (num("MAJOR").unwrap_or(8) as u32, num("MINOR").unwrap_or(16) as u32),
        devlinks: props.get("DEVLINKS").map(|l| l.split_whitespace().map(PathBuf::from).collect()).unwrap_or_default(),
        size: num("SIZE").unwrap_or(1 << 40),
        logical_block_size: 512,
        rotational: props.get("ID_ATA_ROTATION_RATE_RPM").is_some_and(|v| v != "0"),
        loop_backing_file: props.get("BACKING_FILE").map(PathBuf::from),
        partitions: if props.contains_key("ID_PART_ENTRY_UUID") { vec![part] } else { Vec::new() },
        examined: Some(Ok(gpt::Contents::Blank)),
        udev_initialized: true,
        props,
        ..Default::default()
    }
}

/// Target `udev`: a udev property dump, classified as the drive inventory classifies a
/// probe: is it a drive, its media, transport, stable id, class and reason.
pub fn udev(input: &[u8]) {
    use crate::actors::inventory::classify;
    let p = probe_of(&text(input));
    let _ = classify::media_of(&p);
    let _ = classify::transport_of(&p);
    let id = classify::stable_id(&p);
    assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)), "stable id {id:?} holds more than [A-Za-z0-9._-]");
    let _ = crate::disk::udev::strip_partition_suffix(&p.name);
    let _ = gpt::is_drivelet_table(p.prop("ID_PART_TABLE_TYPE"), p.prop("ID_PART_TABLE_UUID"));
    let own = classify::Ownership { me: Some(crate::words::Owner { cluster: "c".into(), node: "n".into() }), known: Default::default() };
    let usage = crate::disk::mounts::HostUsage::default();
    for allow_loop in [false, true] {
        let _ = classify::classify(&p, &usage, &crate::config::DriveFilters::default(), allow_loop, &own);
    }
}

/// Target `smartctl`: `smartctl --json` output, assessed as the health poller assesses
/// it, under the exit statuses smartctl gives.
pub fn smartctl(input: &[u8]) {
    let t = text(input);
    let th = crate::disk::smart::SmartThresholds::default();
    for status in [0, 4, 64, i32::from(input.last().copied().unwrap_or(0))] {
        let r = crate::disk::smart::assess(&t, status, &th);
        let _ = r.reason();
    }
}

/// Target `blkid`: `blkid -p -o export` output, read as the writer and the inventory
/// read it, and put in words.
pub fn blkid(input: &[u8]) {
    let t = text(input);
    let p = crate::disk::fs::probed_of(&t);
    let _ = p.signature_words();
    let _ = crate::disk::fs::signature_of(&t);
    if let Some(pt) = &p.pt_type {
        let _ = crate::disk::signature::describe_table(pt, Some(2));
    }
    let _ = crate::disk::signature::describe(p.fs_type.as_deref().unwrap_or(""), p.usage.as_deref(), p.version.as_deref());
}

/// Target `dumpe2fs`: `dumpe2fs -h` output, read as the offline grow reads it, and the
/// size resize2fs would grow that filesystem to on devices of several sizes.
pub fn dumpe2fs(input: &[u8]) {
    let t = text(input);
    if let Some(g) = crate::disk::fs::ext4_geometry_of(&t) {
        for dev in [0, 4096, g.block_count.saturating_mul(g.block_size).saturating_mul(2), 1 << 40, u64::MAX] {
            let _ = crate::disk::fs::ext4_grow_target(&g, dev);
        }
    }
}

// ---- what admins and the cluster send ----

/// Target `config`: a configuration file, loaded and validated as `drivelet run` and
/// `drivelet check-config` load it; each line also as a size and a duration.
pub fn config(input: &[u8]) {
    let t = text(input);
    let path = scratch_image().with_extension("toml");
    if std::fs::write(&path, &t).is_ok() {
        let _ = crate::config::Config::load(Some(&path));
    }
    for line in t.lines().take(64) {
        let v = line.rsplit('=').next().unwrap_or(line).trim().trim_matches('"');
        let _ = crate::config::parse_size(v);
        let _ = crate::config::parse_duration(v);
    }
}

/// Target `admin_request`: lines on the admin socket, decoded as the admin server
/// decodes each; a request that decodes encodes back to itself.
pub fn admin_request(input: &[u8]) {
    use crate::grpc::admin::AdminRequest;
    for line in text(input).lines() {
        if let Ok(req) = serde_json::from_str::<AdminRequest>(line) {
            let again = serde_json::to_string(&req).expect("a request encodes");
            assert_eq!(serde_json::from_str::<AdminRequest>(&again).ok(), Some(req), "a request does not decode to itself");
        }
    }
}

/// Target `migration_pv`: a PersistentVolume (YAML or JSON, as the API sends it)
/// translated as CSI migration translates in-tree `local` PVs, and the local origin read
/// back from a translated one (what the adoption of a migrated volume reads).
pub fn migration_pv(input: &[u8]) {
    use k8s_openapi::api::core::v1::PersistentVolume;
    let t = text(input);
    let Ok(pv) = serde_norway::from_str::<PersistentVolume>(&t) else { return };
    let tr = crate::migration::Translator::new("csi.drivelet.io", true);
    let _ = crate::migration::node_of(&pv);
    let _ = tr.local_origin(&pv);
    if let Ok(csi) = tr.translate_to_csi(&pv) {
        let _ = tr.local_origin(&csi);
    }
}

/// Target `store_record`: a record of the state dir's store, decoded as start-up
/// decodes each (a volume record, a drive's usage).
pub fn store_record(input: &[u8]) {
    let _ = serde_json::from_slice::<crate::actors::volumes::model::VolumeRecord>(input);
    let _ = serde_json::from_slice::<crate::words::DriveUse>(input);
}

/// A freeze journal entry of the state dir (`disk::freeze::Record`), as start-up reads
/// it: one that decodes encodes back to the same bytes.
pub fn freeze_record(input: &[u8]) {
    if let Ok(r) = crate::disk::freeze::Record::decode(input) {
        assert_eq!(crate::disk::freeze::Record::decode(&r.encode()), Ok(r), "a freeze record does not decode to itself");
    }
}

/// The id of a seed input: what names it in a corpus directory.
pub fn seed_name(input: &[u8]) -> String {
    format!("{:08x}", clean::crc32(input))
}

/// Store records as drivelet writes them, for the `store_record` corpus: a volume
/// created, one staged and published, a drive's usage.
pub fn sample_store_records() -> Vec<Vec<u8>> {
    use crate::actors::volumes::model::{Staging, Target, VolumeRecord, VolumeState};
    let mut a = VolumeRecord::new("6f1b8c9e-6a35-5a1f-9d4e-1f0c2b3a4d5e".into(), "pvc-1".into(), VolumeState::Creating, 1_700_000_000);
    a.drive_id = "wwn-0x5000c500a1b2c3d4".into();
    a.start = 1 << 20;
    a.size = 1 << 30;
    a.fs_type = "ext4".into();
    let mut b = a.clone();
    b.state = VolumeState::Available;
    b.formatted = true;
    b.staging = Some(Staging { path: "/var/lib/kubelet/plugins/kubernetes.io/csi/csi.drivelet.io/x/globalmount".into(), block: false, flags: vec!["noatime".into()], readonly: false, done: true });
    b.targets.insert("/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pvc-1/mount".into(), Target { readonly: false, block: false, done: true });
    let use_ = crate::words::DriveUse {
        drive_id: "wwn-0x5000c500a1b2c3d4".into(),
        state: crate::words::DriveUseState::Releasing,
        reason: "released by an admin".into(),
        requested: true,
        evacuate: None,
    };
    let mut out: Vec<Vec<u8>> = [a, b].iter().filter_map(|r| serde_json::to_vec(r).ok()).collect();
    out.extend(serde_json::to_vec(&use_).ok());
    out
}
