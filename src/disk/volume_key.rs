//! An encrypted volume's key: made by drivelet, wrapped by a key-encryption key (KEK)
//! that never touches a drive, and kept wrapped in the volume's own partition, where it
//! travels with the data (a move copies it) and is destroyed with one write
//! (crypto-erase).
//!
//! Rules:
//! - the header lives in the first KiB of the volume's partition, which ext4 never uses
//!   (its superblock starts at byte 1024, whatever its block size), as two 512-byte
//!   slots; each holds magic, version, a sequence number, the volume id, the KEK's
//!   fingerprint, a nonce and the key wrapped by AES-256-GCM (the volume id and the
//!   fingerprint bound in as associated data, so a header copied onto another volume
//!   does not open), and a CRC-32. A reader takes the valid slot with the highest
//!   sequence; a writer writes both, one after the other, each synced, so a write cut
//!   short leaves a whole header in the other slot;
//! - the header is written only while the filesystem is not mounted (the partition is
//!   opened exclusively, which the kernel refuses while it is), after mkfs (which clears
//!   the first KiB);
//! - erasing writes zeros over both slots and syncs: from then on no copy of the key
//!   exists (it never left the partition, and drivelet keeps none: not in the store,
//!   not in memory after the call);
//! - the KEKs come from the StorageClass's Secret as text (base64 or hex of 32 bytes):
//!   `key` (wraps new keys and is the one rotation moves to), `previous-key` (optional,
//!   one or more separated by spaces or commas: keys still opened and then rewrapped with
//!   `key`). A fingerprint (16 bytes of a SHA-256 over a label and the KEK) names which
//!   KEK a header needs; the KEKs themselves are never shown;
//! - every length read is fixed; nothing read from the disk is allocated by size.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

use base64::Engine;
use ring::aead;
use ring::rand::{SecureRandom, SystemRandom};
use uuid::Uuid;
use zeroize::{Zeroize, Zeroizing};

use super::fscrypt::KEY_LEN;
use super::DiskError;

/// Bytes of the partition the header occupies (two slots).
pub const HEADER_LEN: usize = 1024;
const SLOT: usize = 512;
const MAGIC: &[u8; 8] = b"DRVLKEY1";
const VERSION: u32 = 1;
/// Offsets within a slot.
const SEQ: usize = 12;
const VOLUME: usize = 20;
const FINGERPRINT: usize = 36;
const NONCE: usize = 52;
const WRAPPED: usize = 64;
const WRAPPED_LEN: usize = KEY_LEN + 16;
const CRC: usize = WRAPPED + WRAPPED_LEN;

/// The Secret's entry holding the KEK new keys are wrapped with.
pub const SECRET_KEY: &str = "key";
/// The Secret's entry holding earlier KEKs, still opened, then rewrapped.
pub const SECRET_PREVIOUS: &str = "previous-key";

/// A key-encryption key (32 bytes), wiped when dropped and never shown.
#[derive(Clone)]
pub struct Kek {
    key: Zeroizing<[u8; 32]>,
    fingerprint: [u8; 16],
}

impl std::fmt::Debug for Kek {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kek({})", self.fingerprint_hex())
    }
}

impl Kek {
    /// A KEK from its 32 bytes.
    pub fn new(bytes: [u8; 32]) -> Kek {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(b"drivelet key-encryption key fingerprint v1\0");
        ctx.update(&bytes);
        let d = ctx.finish();
        let mut fingerprint = [0u8; 16];
        fingerprint.copy_from_slice(&d.as_ref()[..16]);
        Kek { key: Zeroizing::new(bytes), fingerprint }
    }

    /// Parses a KEK given as text: 64 hex digits, or base64 of 32 bytes. The error never
    /// holds the text.
    pub fn parse(text: &str) -> Result<Kek, String> {
        let t = text.trim();
        let mut bytes = Zeroizing::new([0u8; 32]);
        if t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit()) {
            for (i, pair) in t.as_bytes().chunks(2).enumerate() {
                let hex = |b: u8| (b as char).to_digit(16).unwrap_or(0) as u8;
                bytes[i] = hex(pair[0]) << 4 | hex(pair[1]);
            }
            return Ok(Kek::new(*bytes));
        }
        let decoded = Zeroizing::new(
            base64::engine::general_purpose::STANDARD
                .decode(t)
                .map_err(|_| "is neither 64 hex digits nor base64".to_string())?,
        );
        if decoded.len() != 32 {
            return Err(format!("is {} bytes once decoded from base64; a key-encryption key is 32 bytes", decoded.len()));
        }
        bytes.copy_from_slice(&decoded);
        Ok(Kek::new(*bytes))
    }

    /// The fingerprint in hex (what errors and logs may show).
    pub fn fingerprint_hex(&self) -> String {
        hex(&self.fingerprint)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The KEKs a call was given: the one to wrap with and earlier ones still accepted.
#[derive(Clone, Debug)]
pub struct Keks {
    /// Wraps new keys; a key opened with an earlier one is rewrapped with it.
    pub current: Kek,
    /// Earlier KEKs.
    pub previous: Vec<Kek>,
}

/// Why a call's KEKs cannot be used, in words that never hold a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KekError {
    /// The call carried no Secret, or one without `key`.
    #[error("no key-encryption key was given: the StorageClass must name a Secret (csi.storage.k8s.io/{kind}-secret-name and -namespace) whose entry \"{SECRET_KEY}\" holds 32 random bytes in base64 or hex")]
    Missing {
        /// Which of the class's secrets the call gets: `node-stage` or `provisioner`.
        kind: &'static str,
    },
    /// An entry that is not a key.
    #[error("the Secret's entry {entry:?} {reason}")]
    Malformed {
        /// `key` or `previous-key`.
        entry: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl Keks {
    /// The KEKs of a CSI call's secrets: `None` when it carried no `key` entry.
    pub fn from_secrets(secrets: &HashMap<String, String>) -> Result<Option<Keks>, KekError> {
        let Some(current) = secrets.get(SECRET_KEY) else { return Ok(None) };
        let current = Kek::parse(current).map_err(|reason| KekError::Malformed { entry: SECRET_KEY, reason })?;
        let mut previous = Vec::new();
        if let Some(p) = secrets.get(SECRET_PREVIOUS) {
            for part in p.split(|c: char| c == ',' || c.is_whitespace()).filter(|s| !s.is_empty()).take(16) {
                previous.push(Kek::parse(part).map_err(|reason| KekError::Malformed { entry: SECRET_PREVIOUS, reason })?);
            }
        }
        Ok(Some(Keks { current, previous }))
    }

    fn find(&self, fingerprint: &[u8; 16]) -> Option<(&Kek, bool)> {
        if self.current.fingerprint == *fingerprint {
            return Some((&self.current, true));
        }
        self.previous.iter().find(|k| k.fingerprint == *fingerprint).map(|k| (k, false))
    }
}

/// A volume's key (64 bytes), wiped when dropped.
pub type VolumeKey = Zeroizing<[u8; KEY_LEN]>;

/// Makes a new random volume key.
pub fn new_key() -> Result<VolumeKey, DiskError> {
    let mut k = Zeroizing::new([0u8; KEY_LEN]);
    SystemRandom::new().fill(&mut k[..]).map_err(|_| DiskError::invalid("the kernel's random numbers cannot be read"))?;
    Ok(k)
}

/// One slot as decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    /// No magic: never written, or erased.
    Empty,
    /// The magic and a failed check (in words).
    Bad(String),
    /// A whole header.
    Valid(Header),
}

/// A decoded header: the wrapped key and what it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    seq: u64,
    volume: Uuid,
    fingerprint: [u8; 16],
    nonce: [u8; 12],
    wrapped: [u8; WRAPPED_LEN],
}

/// What a partition's first KiB holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyState {
    /// No key: never given one, or erased.
    Absent,
    /// A header that cannot be read (why).
    Unreadable(String),
    /// The current header.
    Key(Header),
}

impl Header {
    /// Its sequence number (a rewrite goes after it).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The fingerprint of the KEK that opens it, in hex.
    pub fn fingerprint_hex(&self) -> String {
        hex(&self.fingerprint)
    }
}

/// Decodes one 512-byte slot.
pub fn decode(b: &[u8]) -> Slot {
    if b.len() < SLOT || &b[..8] != MAGIC {
        return Slot::Empty;
    }
    let version = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
    if version != VERSION {
        return Slot::Bad(format!("a key header of format {version}, which this drivelet does not know (it knows {VERSION})"));
    }
    let crc = u32::from_le_bytes([b[CRC], b[CRC + 1], b[CRC + 2], b[CRC + 3]]);
    if super::clean::crc32(&b[..CRC]) != crc {
        return Slot::Bad("a key header whose checksum does not match (torn or corrupt)".into());
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&b[SEQ..SEQ + 8]);
    let mut volume = [0u8; 16];
    volume.copy_from_slice(&b[VOLUME..VOLUME + 16]);
    let mut fingerprint = [0u8; 16];
    fingerprint.copy_from_slice(&b[FINGERPRINT..FINGERPRINT + 16]);
    let mut nonce = [0u8; 12];
    nonce.copy_from_slice(&b[NONCE..NONCE + 12]);
    let mut wrapped = [0u8; WRAPPED_LEN];
    wrapped.copy_from_slice(&b[WRAPPED..WRAPPED + WRAPPED_LEN]);
    Slot::Valid(Header { seq: u64::from_le_bytes(seq), volume: Uuid::from_bytes(volume), fingerprint, nonce, wrapped })
}

/// Encodes a header into one slot.
pub fn encode(h: &Header) -> [u8; SLOT] {
    let mut b = [0u8; SLOT];
    b[..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[SEQ..SEQ + 8].copy_from_slice(&h.seq.to_le_bytes());
    b[VOLUME..VOLUME + 16].copy_from_slice(h.volume.as_bytes());
    b[FINGERPRINT..FINGERPRINT + 16].copy_from_slice(&h.fingerprint);
    b[NONCE..NONCE + 12].copy_from_slice(&h.nonce);
    b[WRAPPED..WRAPPED + WRAPPED_LEN].copy_from_slice(&h.wrapped);
    let crc = super::clean::crc32(&b[..CRC]);
    b[CRC..CRC + 4].copy_from_slice(&crc.to_le_bytes());
    b
}

/// What the first KiB of volume `volume`'s partition says (the bytes as read).
pub fn state_of(bytes: &[u8], volume: Uuid) -> KeyState {
    let slots: Vec<Slot> = bytes.chunks(SLOT).take(2).map(decode).collect();
    let mut best: Option<Header> = None;
    let mut bad = None;
    for s in slots {
        match s {
            Slot::Valid(h) if h.volume != volume => bad = Some(format!("a key header of another volume ({})", h.volume)),
            Slot::Valid(h) => {
                if best.as_ref().is_none_or(|b| h.seq > b.seq) {
                    best = Some(h);
                }
            }
            Slot::Bad(r) => bad = Some(r),
            Slot::Empty => {}
        }
    }
    match (best, bad) {
        (Some(h), _) => KeyState::Key(h),
        (None, Some(r)) => KeyState::Unreadable(r),
        (None, None) => KeyState::Absent,
    }
}

fn aad(volume: Uuid, fingerprint: &[u8; 16]) -> Vec<u8> {
    let mut a = b"drivelet volume key v1\0".to_vec();
    a.extend_from_slice(volume.as_bytes());
    a.extend_from_slice(fingerprint);
    a
}

fn aead_key(kek: &Kek) -> aead::LessSafeKey {
    // AES-256-GCM takes any 32-byte key: this cannot fail.
    aead::LessSafeKey::new(aead::UnboundKey::new(&aead::AES_256_GCM, &kek.key[..]).unwrap_or_else(|_| unreachable!("a 32-byte AES-256 key")))
}

/// Wraps `key` for volume `volume` with `kek`.
pub fn wrap(key: &VolumeKey, volume: Uuid, kek: &Kek, seq: u64) -> Result<Header, DiskError> {
    let mut nonce = [0u8; 12];
    SystemRandom::new().fill(&mut nonce).map_err(|_| DiskError::invalid("the kernel's random numbers cannot be read"))?;
    let mut buf = Zeroizing::new(key.to_vec());
    aead_key(kek)
        .seal_in_place_append_tag(aead::Nonce::assume_unique_for_key(nonce), aead::Aad::from(aad(volume, &kek.fingerprint)), &mut *buf)
        .map_err(|_| DiskError::invalid("the volume's key cannot be wrapped"))?;
    let mut wrapped = [0u8; WRAPPED_LEN];
    wrapped.copy_from_slice(&buf);
    Ok(Header { seq, volume, fingerprint: kek.fingerprint, nonce, wrapped })
}

/// Why a header does not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnwrapError {
    /// No KEK given has the header's fingerprint.
    #[error("its key is wrapped by a key-encryption key with fingerprint {fingerprint}, which the Secret does not hold (it holds {given}): put that key back as \"{SECRET_KEY}\" or \"{SECRET_PREVIOUS}\"")]
    UnknownKek {
        /// The header's fingerprint.
        fingerprint: String,
        /// The fingerprints given.
        given: String,
    },
    /// The KEK with that fingerprint does not open it.
    #[error("its wrapped key does not open with the key-encryption key of fingerprint {fingerprint} (the header is corrupt)")]
    Corrupt {
        /// The header's fingerprint.
        fingerprint: String,
    },
}

/// Opens a header with one of `keks`: the key, and whether it was opened with the
/// current KEK (else it should be rewrapped).
pub fn unwrap(h: &Header, keks: &Keks) -> Result<(VolumeKey, bool), UnwrapError> {
    let (kek, current) = keks.find(&h.fingerprint).ok_or_else(|| UnwrapError::UnknownKek {
        fingerprint: h.fingerprint_hex(),
        given: std::iter::once(&keks.current).chain(&keks.previous).map(Kek::fingerprint_hex).collect::<Vec<_>>().join(", "),
    })?;
    let mut buf = Zeroizing::new(h.wrapped.to_vec());
    let plain = aead_key(kek)
        .open_in_place(aead::Nonce::assume_unique_for_key(h.nonce), aead::Aad::from(aad(h.volume, &h.fingerprint)), &mut buf)
        .map_err(|_| UnwrapError::Corrupt { fingerprint: h.fingerprint_hex() })?;
    let mut key = Zeroizing::new([0u8; KEY_LEN]);
    if plain.len() != KEY_LEN {
        return Err(UnwrapError::Corrupt { fingerprint: h.fingerprint_hex() });
    }
    key.copy_from_slice(plain);
    plain.zeroize();
    Ok((key, current))
}

/// Opens a volume's kernel partition for its header: exclusively (refused while
/// mounted or held), checked to be the device `devnum` by its descriptor.
pub fn open_partition(devnode: &std::path::Path, devnum: (u32, u32)) -> Result<File, DiskError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_EXCL | libc::O_CLOEXEC)
        .open(devnode)
        .map_err(|e| DiskError::Io { what: format!("{} (for its key header)", devnode.display()), source: e })?;
    let md = f.metadata().map_err(|e| DiskError::Io { what: devnode.display().to_string(), source: e })?;
    let rdev = md.rdev();
    let got = (nix::sys::stat::major(rdev) as u32, nix::sys::stat::minor(rdev) as u32);
    if !md.file_type().is_block_device() || got != devnum {
        return Err(DiskError::invalid(format!("{} is not the volume's partition {}:{}", devnode.display(), devnum.0, devnum.1)));
    }
    Ok(f)
}

/// Whether the partition `f` starts with a key header (valid or not): an encrypted
/// volume's, or a snapshot of one.
pub fn present(f: &File) -> std::io::Result<bool> {
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, 0)?;
    Ok(&b == MAGIC)
}

/// Reads the header of volume `volume` from its partition `f`.
pub fn read(f: &File, volume: Uuid) -> Result<KeyState, DiskError> {
    let mut b = [0u8; HEADER_LEN];
    f.read_exact_at(&mut b, 0).map_err(|e| DiskError::Io { what: "the volume's key header".into(), source: e })?;
    Ok(state_of(&b, volume))
}

fn write_slot(f: &File, slot: usize, bytes: &[u8]) -> Result<(), DiskError> {
    f.write_all_at(bytes, (slot * SLOT) as u64).map_err(|e| DiskError::Io { what: "the volume's key header".into(), source: e })?;
    f.sync_data().map_err(|e| DiskError::Io { what: "the volume's key header (sync)".into(), source: e })
}

/// Writes `key`, wrapped with `kek`, into both slots of `f` (after sequence `after`),
/// one then the other, each synced.
pub fn write(f: &File, volume: Uuid, key: &VolumeKey, kek: &Kek, after: u64) -> Result<(), DiskError> {
    for slot in [0usize, 1] {
        let h = wrap(key, volume, kek, after + 1 + slot as u64)?;
        write_slot(f, slot, &encode(&h))?;
    }
    Ok(())
}

/// The sequence of a header (for the next write).
pub fn seq_of(state: &KeyState) -> u64 {
    match state {
        KeyState::Key(h) => h.seq,
        _ => 0,
    }
}

/// Destroys the key: zeros over both slots, synced.
pub fn erase(f: &File) -> Result<(), DiskError> {
    write_slot(f, 0, &[0u8; HEADER_LEN])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keks(k: u8) -> Keks {
        Keks { current: Kek::new([k; 32]), previous: vec![] }
    }

    #[test]
    fn a_wrapped_key_opens_with_its_kek_only_and_for_its_volume_only() {
        let v = Uuid::from_u128(7);
        let key = new_key().unwrap();
        let h = wrap(&key, v, &keks(1).current, 1).unwrap();
        let (got, current) = unwrap(&h, &keks(1)).unwrap();
        assert_eq!(*got, *key);
        assert!(current);
        let e = unwrap(&h, &keks(2)).unwrap_err();
        assert!(matches!(e, UnwrapError::UnknownKek { .. }), "{e}");
        assert!(e.to_string().contains(&h.fingerprint_hex()));
        // The header moved onto another volume does not open.
        let mut other = h.clone();
        other.volume = Uuid::from_u128(8);
        assert!(matches!(unwrap(&other, &keks(1)), Err(UnwrapError::Corrupt { .. })));
        // A flipped bit does not open.
        let mut flipped = h.clone();
        flipped.wrapped[3] ^= 1;
        assert!(matches!(unwrap(&flipped, &keks(1)), Err(UnwrapError::Corrupt { .. })));
    }

    #[test]
    fn an_earlier_kek_opens_and_asks_for_a_rewrap() {
        let v = Uuid::from_u128(7);
        let key = new_key().unwrap();
        let h = wrap(&key, v, &Kek::new([1; 32]), 1).unwrap();
        let rotated = Keks { current: Kek::new([2; 32]), previous: vec![Kek::new([1; 32])] };
        let (got, current) = unwrap(&h, &rotated).unwrap();
        assert_eq!(*got, *key);
        assert!(!current);
    }

    #[test]
    fn headers_encode_back_and_the_newest_valid_slot_wins() {
        let v = Uuid::from_u128(9);
        let key = new_key().unwrap();
        let a = wrap(&key, v, &keks(1).current, 4).unwrap();
        let b = wrap(&key, v, &keks(1).current, 5).unwrap();
        assert_eq!(decode(&encode(&a)), Slot::Valid(a.clone()));
        let mut bytes = [encode(&a), encode(&b)].concat();
        assert_eq!(state_of(&bytes, v), KeyState::Key(b.clone()));
        // The newer slot torn: the older is read.
        bytes[SLOT + 100] ^= 0xff;
        assert_eq!(state_of(&bytes, v), KeyState::Key(a));
        // Both torn: unreadable, in words.
        bytes[100] ^= 0xff;
        assert!(matches!(state_of(&bytes, v), KeyState::Unreadable(r) if r.contains("checksum")));
        assert_eq!(state_of(&[0u8; HEADER_LEN], v), KeyState::Absent);
        assert!(matches!(state_of(&[encode(&b), [0; SLOT]].concat(), Uuid::from_u128(1)), KeyState::Unreadable(r) if r.contains("another volume")));
    }

    #[test]
    fn keks_parse_from_hex_or_base64_and_errors_never_show_them() {
        let hex64 = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
        let b64 = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        let s: HashMap<String, String> = [(SECRET_KEY.to_string(), hex64.to_string()), (SECRET_PREVIOUS.to_string(), format!("{b64}, {hex64}"))].into();
        let k = Keks::from_secrets(&s).unwrap().unwrap();
        assert_eq!(k.previous.len(), 2);
        assert_eq!(k.current.fingerprint, k.previous[1].fingerprint);
        assert_eq!(Keks::from_secrets(&HashMap::new()).unwrap().is_none(), true);
        let secret = "c2hvcnQtYnV0LXNlY3JldA==";
        let bad: HashMap<String, String> = [(SECRET_KEY.to_string(), secret.to_string())].into();
        let e = Keks::from_secrets(&bad).unwrap_err().to_string();
        assert!(e.contains("32 bytes") && !e.contains(secret), "{e}");
        let shown = format!("{:?}", k);
        assert!(!shown.contains("0011") && !shown.contains(&b64), "{shown}");
    }
}
