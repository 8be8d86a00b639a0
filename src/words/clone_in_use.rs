//! What a clone of a volume in use does: the StorageClass parameters that choose it and
//! their values (the gRPC front checks them, the volume manager acts on them).
//!
//! A clone names its source claim, which Kubernetes requires to be of the clone's own
//! StorageClass, so these are the source's class's words too.

/// The StorageClass parameter saying what a clone of a filesystem volume in use does.
pub const CLONE_IN_USE: &str = "drivelet.io/clone-in-use";
/// The StorageClass parameter saying what a clone of a block volume in use does.
pub const CLONE_IN_USE_BLOCK: &str = "drivelet.io/clone-in-use-block";
/// The StorageClass parameter capping how long a clone may freeze its source's writers.
pub const CLONE_FREEZE_LIMIT: &str = "drivelet.io/clone-freeze-limit";

/// What a clone of a filesystem volume mounted read-write does (parameter
/// [`CLONE_IN_USE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CloneInUse {
    /// The source's filesystem is frozen for the copy, which is then consistent; its
    /// writers pause for the copy's length, bounded by the freeze limit (default).
    #[default]
    Freeze,
    /// Refused while the source is mounted read-write: the clone is made once no pod
    /// writes to it.
    Refuse,
}

impl CloneInUse {
    /// The parameter's values, as the StorageClass spells them.
    pub const VALUES: &'static str = "freeze or refuse";

    /// Parses a value of the parameter; `""` is the default.
    pub fn parse(v: &str) -> Option<CloneInUse> {
        match v {
            "freeze" | "" => Some(CloneInUse::Freeze),
            "refuse" => Some(CloneInUse::Refuse),
            _ => None,
        }
    }
}

/// What a clone of a block volume in use (written to by a pod) does (parameter
/// [`CLONE_IN_USE_BLOCK`]). A block volume has no filesystem drivelet could freeze.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BlockCloneInUse {
    /// Refused while a pod writes to it (default).
    #[default]
    Refuse,
    /// Copied while it is written: the application accepts a copy that is not even
    /// crash-consistent (blocks of different moments); the clone is marked so.
    CrashInconsistent,
}

impl BlockCloneInUse {
    /// The parameter's values, as the StorageClass spells them.
    pub const VALUES: &'static str = "refuse or crash-inconsistent";

    /// Parses a value of the parameter; `""` is the default.
    pub fn parse(v: &str) -> Option<BlockCloneInUse> {
        match v {
            "refuse" | "" => Some(BlockCloneInUse::Refuse),
            "crash-inconsistent" => Some(BlockCloneInUse::CrashInconsistent),
            _ => None,
        }
    }
}

/// The clone policy of a set of StorageClass parameters (values the front has checked;
/// one it would refuse reads as the default here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClonePolicy {
    /// A filesystem volume in use.
    pub fs: CloneInUse,
    /// A block volume in use.
    pub block: BlockCloneInUse,
}

impl ClonePolicy {
    /// The policy these class parameters ask for.
    pub fn of<'a>(parameters: impl Iterator<Item = (&'a String, &'a String)>) -> ClonePolicy {
        let mut out = ClonePolicy::default();
        for (k, v) in parameters {
            match k.as_str() {
                CLONE_IN_USE => out.fs = CloneInUse::parse(v).unwrap_or_default(),
                CLONE_IN_USE_BLOCK => out.block = BlockCloneInUse::parse(v).unwrap_or_default(),
                _ => {}
            }
        }
        out
    }

    /// The freeze limit these class parameters ask for, as written (parsed by the caller).
    pub fn freeze_limit_of<'a>(mut parameters: impl Iterator<Item = (&'a String, &'a String)>) -> Option<&'a str> {
        parameters.find(|(k, _)| k.as_str() == CLONE_FREEZE_LIMIT).map(|(_, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_values_and_their_defaults() {
        assert_eq!(CloneInUse::parse(""), Some(CloneInUse::Freeze));
        assert_eq!(CloneInUse::parse("freeze"), Some(CloneInUse::Freeze));
        assert_eq!(CloneInUse::parse("refuse"), Some(CloneInUse::Refuse));
        assert_eq!(CloneInUse::parse("Freeze"), None);
        assert_eq!(BlockCloneInUse::parse(""), Some(BlockCloneInUse::Refuse));
        assert_eq!(BlockCloneInUse::parse("crash-inconsistent"), Some(BlockCloneInUse::CrashInconsistent));
        assert_eq!(BlockCloneInUse::parse("freeze"), None);
        let p = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
        let of = |kv: &[(&str, &str)]| {
            let v = p(kv);
            ClonePolicy::of(v.iter().map(|(k, v)| (k, v)))
        };
        assert_eq!(of(&[]), ClonePolicy { fs: CloneInUse::Freeze, block: BlockCloneInUse::Refuse });
        assert_eq!(
            of(&[(CLONE_IN_USE, "refuse"), (CLONE_IN_USE_BLOCK, "crash-inconsistent"), ("media", "ssd")]),
            ClonePolicy { fs: CloneInUse::Refuse, block: BlockCloneInUse::CrashInconsistent }
        );
        let v = p(&[(CLONE_FREEZE_LIMIT, "3s")]);
        assert_eq!(ClonePolicy::freeze_limit_of(v.iter().map(|(k, v)| (k, v))), Some("3s"));
    }
}
