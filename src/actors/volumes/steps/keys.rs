//! An encrypted volume's key in its steps: made at the first stage, opened (and
//! rewrapped after a key-encryption key rotation) at every stage, added to the mounted
//! filesystem with its data directory encrypted, removed at unstage, and destroyed
//! (crypto-erase) before a move lets its old partition go (a delete's wipe, whose first
//! write is the partition's first MiB, destroys it there).
//!
//! Rules:
//! - the key-encryption keys come with the call (the StorageClass's Secret, which
//!   kubelet or the provisioner reads and passes); drivelet never stores them and never
//!   reads a Secret itself;
//! - a key is made only for a filesystem this very call made: an encrypted volume
//!   formatted before whose partition holds no key was erased (or damaged), and is
//!   refused, never given a new key that would hide what it held;
//! - the header is written only while the filesystem is not mounted; it is read (never
//!   written) when the volume is mounted already;
//! - nothing here logs a key, a key-encryption key or a secret: only fingerprints.

use tracing::info;
use uuid::Uuid;

use crate::actors::volumes::error::VolumeError;
use crate::actors::volumes::messages::Secrets;
use crate::actors::volumes::model::VolumeRecord;
use crate::disk::beneath::Node;
use crate::disk::blkpg::KernelPartition;
use crate::disk::volume_key::{self, KeyState, Keks, VolumeKey};
use crate::disk::{fscrypt, DiskError};

fn refused(id: &str, reason: impl Into<String>) -> VolumeError {
    VolumeError::EncryptionKey { volume_id: id.to_string(), reason: reason.into() }
}

fn disk_err<'a>(id: &'a str, what: &'static str) -> impl FnOnce(DiskError) -> VolumeError + 'a {
    move |e| refused(id, format!("cannot {what}: {e}"))
}

fn guid(rec: &VolumeRecord) -> Result<Uuid, VolumeError> {
    Uuid::parse_str(&rec.id).map_err(|_| refused(&rec.id, "its id is not the partition GUID an encrypted volume's key is bound to"))
}

/// The key-encryption keys a call carries for the encrypted volume `id`: an error in
/// words when there are none or one is malformed (checked before anything changes).
/// `kind` names the class's secret the call gets (`node-stage` or `provisioner`).
pub(crate) fn keks(id: &str, secrets: &Secrets, kind: &'static str) -> Result<Keks, VolumeError> {
    if !fscrypt::supported() {
        return Err(refused(id, format!("this node's kernel cannot encrypt ext4 ({} is absent)", fscrypt::EXT4_FEATURE)));
    }
    match Keks::from_secrets(&secrets.0) {
        Ok(Some(k)) => Ok(k),
        Ok(None) => Err(refused(id, volume_key::KekError::Missing { kind }.to_string())),
        Err(e) => Err(VolumeError::InvalidArgument { reason: format!("volume {id}: {e}") }),
    }
}

/// Makes the key of a volume whose filesystem this call just made, and writes it
/// wrapped into the partition (not mounted).
pub(crate) fn make(rec: &VolumeRecord, kp: &KernelPartition, keks: &Keks) -> Result<VolumeKey, VolumeError> {
    let id = &rec.id;
    let f = volume_key::open_partition(&kp.devnode, kp.devnum).map_err(disk_err(id, "open the partition for its key"))?;
    let key = volume_key::new_key().map_err(disk_err(id, "make a key"))?;
    volume_key::write(&f, guid(rec)?, &key, &keks.current, 0).map_err(disk_err(id, "write the wrapped key"))?;
    info!(volume.id = %id, kek = %keks.current.fingerprint_hex(), "volume key made, wrapped by the key-encryption key of this fingerprint");
    Ok(key)
}

/// Opens the key of a volume formatted before. `mounted`: the filesystem is mounted
/// already (the header is then only read, not rewrapped).
pub(crate) fn open(rec: &VolumeRecord, kp: &KernelPartition, keks: &Keks, mounted: bool) -> Result<VolumeKey, VolumeError> {
    open_bound(&rec.id, guid(rec)?, kp, keks, mounted)
}

/// [`open`] of the header in `kp` bound to the volume `owner` (a snapshot's header is
/// its volume's), errors naming `id`.
pub(crate) fn open_bound(id: &str, owner: Uuid, kp: &KernelPartition, keks: &Keks, mounted: bool) -> Result<VolumeKey, VolumeError> {
    let f = if mounted {
        std::fs::File::open(&kp.devnode).map_err(|e| refused(id, format!("cannot read its partition {}: {e}", kp.devnode.display())))?
    } else {
        volume_key::open_partition(&kp.devnode, kp.devnum).map_err(disk_err(id, "open the partition for its key"))?
    };
    let state = volume_key::read(&f, owner).map_err(disk_err(id, "read its key header"))?;
    let h = match &state {
        KeyState::Key(h) => h,
        KeyState::Absent => {
            return Err(refused(id, "its partition holds no key (it was erased when the volume was deleted, or overwritten): its data cannot be read by anyone"))
        }
        KeyState::Unreadable(r) => return Err(refused(id, format!("its key header cannot be read: {r}"))),
    };
    let (key, current) = volume_key::unwrap(h, keks).map_err(|e| refused(id, e.to_string()))?;
    if !current && !mounted {
        volume_key::write(&f, owner, &key, &keks.current, volume_key::seq_of(&state)).map_err(disk_err(id, "rewrap its key"))?;
        info!(volume.id = %id, from = %h.fingerprint_hex(), to = %keks.current.fingerprint_hex(), "volume key rewrapped with the current key-encryption key");
    }
    Ok(key)
}

/// Adds `key` to the filesystem mounted at `root` (the staging path, opened and checked
/// by the caller) and makes sure its data directory is encrypted under it.
pub(crate) fn unlock(id: &str, root: &Node, key: &VolumeKey) -> Result<(), VolumeError> {
    let dir = root.reopen_dir().map_err(disk_err(id, "open the staged filesystem"))?;
    let ident = fscrypt::add_key(&dir, key).map_err(disk_err(id, "add its key to the filesystem"))?;
    fscrypt::ensure_data_dir(&dir, &ident).map_err(disk_err(id, "encrypt its data directory"))?;
    Ok(())
}

/// Removes the key of the filesystem mounted at `root` (before its unmount, which
/// drops it too): its files show only as ciphertext from here on.
pub(crate) fn lock(id: &str, root: &Node) -> Result<(), VolumeError> {
    let dir = root.reopen_dir().map_err(disk_err(id, "open the staged filesystem"))?;
    if let Some(ident) = fscrypt::data_dir_key(&dir).map_err(disk_err(id, "read its data directory's policy"))? {
        if fscrypt::remove_key(&dir, &ident).map_err(disk_err(id, "remove its key from the filesystem"))? {
            info!(volume.id = %id, "volume key removed while some of its files were still open");
        }
    }
    Ok(())
}

/// Crypto-erase: destroys the wrapped key in the volume's partition `kp` (zeros over
/// its header, synced). After this, the partition's bytes are ciphertext no key opens.
pub(crate) fn erase(id: &str, kp: &KernelPartition) -> Result<(), VolumeError> {
    let f = volume_key::open_partition(&kp.devnode, kp.devnum).map_err(disk_err(id, "open the partition to erase its key"))?;
    volume_key::erase(&f).map_err(disk_err(id, "erase its key"))?;
    info!(volume.id = %id, "volume key erased: the partition holds only ciphertext no key opens");
    Ok(())
}

/// The data directory an encrypted volume's targets show, beneath its staged root.
pub(crate) fn data_dir(id: &str, staged: &Node) -> Result<Node, VolumeError> {
    staged.child_dir(fscrypt::DATA_DIR).map_err(disk_err(id, "open its data directory"))
}
