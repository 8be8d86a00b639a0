//! The copy of a moving volume: every byte of its partition onto its new one, read
//! once, sequentially, checksummed as read, then verified by reading the copy back.
//!
//! Rules:
//! - both devices are opened `O_DIRECT`: the source is read from the disk itself (no
//!   stale cache, and a bad block answers its own error), the copy written past the
//!   cache and fsynced before it is read back;
//! - the source is read exactly once, in order, 1 MiB at a time (a failing drive is
//!   spared re-reads); a chunk that does not read is read again 4 KiB at a time, only
//!   to tell which blocks fail, and those blocks are written as zeros; the failed byte
//!   ranges (relative to the partition, merged) are answered, never hidden; only a
//!   medium error (EIO and its kin) is read around: any other error (the device is
//!   gone) fails the copy;
//! - the copy is verified chunk by chunk against the CRC-32 of what was read (zeros
//!   where the source failed); a mismatch or a read error of the copy is an error;
//! - the copy is what its caller makes of it: this only reads `src` and writes `dst`;
//! - progress is counted as it goes, for the metrics: bytes written, then bytes read back
//!   and verified, so a copy of `len` bytes ends at `2 * len`.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::clean::crc32;
use super::DiskError;

/// Bytes read and written at a time.
const CHUNK: usize = 1 << 20;
/// The smallest unit a failed chunk is read again in.
const BLOCK: usize = 4096;

/// What a copy did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// Bytes copied (the whole length).
    pub bytes: u64,
    /// Byte ranges `(start, length)` of the source that could not be read; zeros on
    /// the copy. Merged, in order.
    pub unreadable: Vec<(u64, u64)>,
}

/// A 4 KiB-aligned page, for O_DIRECT buffers.
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct Page([u8; BLOCK]);

/// A zeroed, 4 KiB-aligned buffer of `CHUNK` bytes.
struct Buffer(Vec<Page>);

impl Buffer {
    fn new() -> Buffer {
        Buffer(vec![Page([0; BLOCK]); CHUNK / BLOCK])
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `Page` is plain bytes with no padding (`repr(C)`, one array), so the
        // vector's pages are `CHUNK` contiguous, initialised bytes.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<u8>(), self.0.len() * BLOCK) }
    }
}

fn open_direct(dev: &Path, write: bool) -> Result<File, DiskError> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_DIRECT)
        .open(dev)
        .map_err(DiskError::io(format!("open {} (O_DIRECT)", dev.display())))
}

/// Where a test asked reads of the source to fail (fail point `move.unreadable`, armed
/// with `return(START-END)`, bytes of the partition): a stand-in for a failing drive's
/// bad blocks, which loop devices cannot have. Never without the `failpoints` feature.
fn injected_bad_range() -> Option<(u64, u64)> {
    let v = crate::failpoint::injected_value("move.unreadable")?;
    let (a, b) = v.split_once('-')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

fn read_at(f: &File, buf: &mut [u8], at: u64, bad: Option<(u64, u64)>) -> std::io::Result<()> {
    if let Some((s, e)) = bad {
        if at < e && s < at + buf.len() as u64 {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
    }
    f.read_exact_at(buf, at)
}

/// Adds `(start, len)` to the merged, ordered ranges `r`.
fn add_range(r: &mut Vec<(u64, u64)>, start: u64, len: u64) {
    match r.last_mut() {
        Some((s, l)) if *s + *l == start => *l += len,
        _ => r.push((start, len)),
    }
}

/// Copies the first `len` bytes of `src` onto `dst` and verifies the copy (see the
/// module's rules). `len` is a whole number of 4 KiB blocks. `done` counts the bytes
/// written and then those verified (`2 * len` at the end).
pub fn copy_and_verify(src: &Path, dst: &Path, len: u64, done: &AtomicU64) -> Result<Copied, DiskError> {
    if !len.is_multiple_of(BLOCK as u64) {
        return Err(DiskError::invalid(format!("a move copies whole 4 KiB blocks; {len} bytes is not")));
    }
    let room = super::fs::device_size(dst)?;
    if room < len {
        return Err(DiskError::invalid(format!("{} holds {room} bytes, less than the {len} to copy", dst.display())));
    }
    let from = open_direct(src, false)?;
    let to = open_direct(dst, true)?;
    let bad = injected_bad_range();
    let mut buf = Buffer::new();
    let mut sums = Vec::with_capacity((len / CHUNK as u64 + 1) as usize);
    let mut unreadable = Vec::new();
    let mut at = 0u64;
    while at < len {
        let n = ((len - at) as usize).min(CHUNK);
        let b = &mut buf.bytes()[..n];
        if let Err(e) = read_at(&from, b, at, bad) {
            // A device that is gone (or any error but a medium error) fails the copy:
            // reading it again block by block would only fail the same way, slowly.
            if !matches!(e.raw_os_error(), Some(libc::EIO | libc::ENODATA | libc::EILSEQ | libc::EBADMSG)) {
                return Err(DiskError::Io { what: format!("read {} at byte {at}", src.display()), source: e });
            }
            // Which blocks fail: read the chunk again a block at a time.
            for (i, block) in b.chunks_mut(BLOCK).enumerate() {
                let off = at + (i * BLOCK) as u64;
                if read_at(&from, block, off, bad).is_err() {
                    block.fill(0);
                    add_range(&mut unreadable, off, BLOCK as u64);
                }
            }
        }
        sums.push(crc32(b));
        to.write_all_at(b, at).map_err(DiskError::io(format!("write {} at byte {at}", dst.display())))?;
        at += n as u64;
        done.fetch_add(n as u64, Ordering::Relaxed);
    }
    to.sync_all().map_err(DiskError::io(format!("fsync {}", dst.display())))?;
    drop(to);
    let back = open_direct(dst, false)?;
    let mut at = 0u64;
    for sum in sums {
        let n = ((len - at) as usize).min(CHUNK);
        let b = &mut buf.bytes()[..n];
        back.read_exact_at(b, at).map_err(DiskError::io(format!("read back {} at byte {at}", dst.display())))?;
        if crc32(b) != sum {
            return Err(DiskError::invalid(format!(
                "the copy on {} differs from what was read at bytes {at}..{}: not switched to",
                dst.display(),
                at + n as u64
            )));
        }
        at += n as u64;
        done.fetch_add(n as u64, Ordering::Relaxed);
    }
    Ok(Copied { bytes: len, unreadable })
}

/// The ranges in plain words: `4 KiB at byte 1048576, 8 KiB at byte 2097152`.
pub fn ranges_words(r: &[(u64, u64)]) -> String {
    let shown: Vec<String> = r.iter().take(8).map(|(s, l)| format!("{} at byte {s}", crate::config::human_bytes(*l))).collect();
    let more = r.len().saturating_sub(shown.len());
    if more > 0 {
        format!("{} and {more} more ranges", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_bad_blocks_merge_and_apart_ones_stay_apart() {
        let mut r = Vec::new();
        add_range(&mut r, 4096, 4096);
        add_range(&mut r, 8192, 4096);
        add_range(&mut r, 65536, 4096);
        assert_eq!(r, vec![(4096, 8192), (65536, 4096)]);
        assert_eq!(ranges_words(&r), "8.0 KiB at byte 4096, 4.0 KiB at byte 65536");
    }

    #[test]
    fn a_partial_block_is_refused_before_anything_is_opened() {
        // The copy itself runs on real drives: tests/integration/volumes/evacuation.rs
        // (O_DIRECT on files depends on the filesystem under them, and this tier runs
        // unprivileged).
        let e = copy_and_verify(Path::new("/nonexistent/src"), Path::new("/nonexistent/dst"), 1000, &AtomicU64::new(0)).unwrap_err().to_string();
        assert!(e.contains("whole 4 KiB blocks"), "{e}");
    }
}
