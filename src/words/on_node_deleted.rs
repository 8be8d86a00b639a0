//! What happens to a claim once its node's Node object is deleted: a StorageClass
//! parameter the gRPC front checks and the cluster duties act on.

/// The StorageClass parameter saying what happens to a bound claim once its node's Node
/// object is deleted.
pub const ON_NODE_DELETED: &str = "drivelet.io/on-node-deleted";

/// What the cluster duties do with a claim of a deleted node (parameter
/// [`ON_NODE_DELETED`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnNodeDeleted {
    /// The claim stays bound, with a Warning Event saying where its data is (default).
    #[default]
    KeepClaims,
    /// The claim is deleted once no running pod uses it, so it can be made again on a
    /// live node.
    ReleaseClaims,
}

impl OnNodeDeleted {
    /// The parameter's values, as the StorageClass spells them.
    pub const VALUES: [&'static str; 2] = ["keep-claims", "release-claims"];

    /// Parses a value of the parameter; `""` is the default.
    pub fn parse(v: &str) -> Option<OnNodeDeleted> {
        match v {
            "keep-claims" | "" => Some(OnNodeDeleted::KeepClaims),
            "release-claims" => Some(OnNodeDeleted::ReleaseClaims),
            _ => None,
        }
    }

    /// The value as the StorageClass spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            OnNodeDeleted::KeepClaims => "keep-claims",
            OnNodeDeleted::ReleaseClaims => "release-claims",
        }
    }
}
