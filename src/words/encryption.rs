//! Encryption at rest: the StorageClass parameter that asks for it and its values.

/// The StorageClass parameter asking for encrypted volumes.
pub const ENCRYPTION: &str = "drivelet.io/encryption";

/// How a volume's data is encrypted (parameter [`ENCRYPTION`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encryption {
    /// Plaintext (default).
    #[default]
    None,
    /// The kernel's ext4 encryption (fscrypt, policy v2), a key per volume.
    Fscrypt,
}

impl Encryption {
    /// Parses a value of the parameter; `""` and `none` are no encryption.
    pub fn parse(v: &str) -> Option<Encryption> {
        match v {
            "" | "none" => Some(Encryption::None),
            "fscrypt" => Some(Encryption::Fscrypt),
            _ => None,
        }
    }

    /// The encryption a volume of these class parameters has.
    pub fn of<'a>(mut parameters: impl Iterator<Item = (&'a String, &'a String)>) -> Encryption {
        parameters.find(|(k, _)| k.as_str() == ENCRYPTION).and_then(|(_, v)| Encryption::parse(v)).unwrap_or_default()
    }
}
