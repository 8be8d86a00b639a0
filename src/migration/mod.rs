//! CSI migration of Kubernetes in-tree `local` PersistentVolumes (plugin
//! `kubernetes.io/local-volume`): translation of such a PV to a drivelet CSI PV and back,
//! in the shape of Kubernetes' CSI migration library (translate in-tree to CSI, CSI to
//! in-tree, can support, is migrated).
//!
//! Rules:
//! - Only a PV whose single volume source is `spec.local` is translated to CSI; a PV with
//!   `spec.local` and any other source is refused, and so is a PV without a name (the
//!   volume handle is derived from it).
//! - The local path must be non-empty, absolute, free of NUL bytes and of `..`
//!   components. It is kept byte for byte (never normalised), in a volume attribute.
//! - The node is named by the `kubernetes.io/hostname In [<node>]` expressions of the
//!   required node affinity: there must be at least one, each with exactly one value,
//!   all naming the same node, which must be a valid label value. Several values or
//!   several nodes are refused rather than guessed between: a local path lives on one
//!   node. Hostname expressions with other operators (`NotIn`, `Exists`, ...) name no
//!   node; terms without a hostname expression are kept as they are.
//! - The hostname label value is taken to be the node name drivelet reports as
//!   `topology.drivelet.io/node` (`driver.node_name`, from the downward API). Where
//!   kubelet's `--hostname-override` makes the two differ, the translated affinity will
//!   not match the node.
//! - CSI side: `driver` is the configured driver name; `volumeHandle` is
//!   `local-<UUID v5 of "<node>/<pv name>" in HANDLE_NAMESPACE>` (42 bytes, within the
//!   128 bytes CSI allows for an id; neither part can hold a `/`), so the same PV always
//!   gets the same handle and PVs differing in name or node never share one;
//!   `csi.fsType` is the local fsType when one is set and not empty.
//! - Every `kubernetes.io/hostname` match expression (any operator, values kept) gets
//!   drivelet's topology key. Which expressions were rewritten is recorded by position,
//!   so expressions that already used drivelet's key stay as they were on the way back.
//!   Match fields, other expressions and terms, their order, metadata, status and every
//!   other spec field are untouched.
//! - The volume attributes hold what the inverse (and adoption) needs:
//!   `drivelet.io/migrated-from` (the plugin name), `drivelet.io/node`,
//!   `drivelet.io/local-path`, `drivelet.io/local-fstype` (only when the in-tree PV had a
//!   fsType, even an empty one) and `drivelet.io/hostname-expressions` (the rewritten
//!   positions); at most 4 KiB in total, the CSI limit for a map.
//! - CSI to in-tree is the exact inverse and applies only to PVs of this driver carrying
//!   `drivelet.io/migrated-from: kubernetes.io/local-volume`. A record that does not
//!   agree with itself (handle, node, recorded positions, unknown attributes, CSI fields
//!   a local source cannot hold) is refused rather than translated with a loss.
//! - The per-plugin switch (`migration.local`) decides `Translator::is_migrated` only;
//!   the translations work regardless, as in Kubernetes, where the caller consults the
//!   switch before translating.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, LocalVolumeSource, NodeSelectorTerm, PersistentVolume, PersistentVolumeSpec,
};
use uuid::Uuid;

/// The in-tree volume plugin whose PVs this module translates.
pub(crate) const IN_TREE_PLUGIN: &str = "kubernetes.io/local-volume";

/// The node label in-tree local PVs name their node with.
pub(crate) const HOSTNAME_KEY: &str = "kubernetes.io/hostname";

/// Every translated volume handle starts with this; drivelet's own volume ids are bare
/// UUIDs, so the two never collide.
pub(crate) const HANDLE_PREFIX: &str = "local-";

/// The UUID v5 namespace of translated volume handles.
pub(crate) const HANDLE_NAMESPACE: Uuid = uuid::uuid!("773688ae-0314-42ef-8231-28a8c6dcb3c8");

/// Volume attribute marking a CSI PV as translated; its value is [`IN_TREE_PLUGIN`].
pub(crate) const ATTR_MIGRATED_FROM: &str = "drivelet.io/migrated-from";

/// Volume attribute: the node the local path lives on.
pub(crate) const ATTR_NODE: &str = "drivelet.io/node";

/// Volume attribute: the in-tree `local.path`, byte for byte.
pub(crate) const ATTR_LOCAL_PATH: &str = "drivelet.io/local-path";

/// Volume attribute: the in-tree `local.fsType`, present only when it was set.
pub(crate) const ATTR_LOCAL_FSTYPE: &str = "drivelet.io/local-fstype";

/// Volume attribute: the node affinity expressions whose key was `kubernetes.io/hostname`,
/// as `<term index>.<expression index>` pairs joined by `,` in ascending order, e.g.
/// `0.0,2.1` (indexes into `spec.nodeAffinity.required.nodeSelectorTerms` and their
/// `matchExpressions`).
pub(crate) const ATTR_HOSTNAME_EXPRESSIONS: &str = "drivelet.io/hostname-expressions";

const ATTRIBUTES: [&str; 5] =
    [ATTR_MIGRATED_FROM, ATTR_NODE, ATTR_LOCAL_PATH, ATTR_LOCAL_FSTYPE, ATTR_HOSTNAME_EXPRESSIONS];

/// CSI: a string field (a volume id) is at most 128 bytes.
#[cfg(test)]
pub(crate) const MAX_HANDLE_BYTES: usize = 128;

/// CSI: a `map<string, string>` (the volume context) is at most 4 KiB.
pub(crate) const MAX_ATTRIBUTE_BYTES: usize = 4096;

/// What is wrong with a local path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathProblem {
    /// The path is empty.
    Empty,
    /// The path does not start with `/`.
    Relative,
    /// A component of the path is `..`.
    DotDot,
    /// The path contains a NUL byte.
    Nul,
}

impl fmt::Display for PathProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PathProblem::Empty => "it is empty",
            PathProblem::Relative => "it is not absolute",
            PathProblem::DotDot => "it has a `..` component",
            PathProblem::Nul => "it contains a NUL byte",
        })
    }
}

/// Why a PV cannot be translated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranslateError {
    /// The PV has no `metadata.name`.
    #[error("a PersistentVolume without metadata.name cannot be translated: its volume handle is derived from the name; give the PV its name")]
    Unnamed,
    /// The PV has no `spec.local` source.
    #[error("PV {pv} has no spec.local source, so it is not a {IN_TREE_PLUGIN} PV; only local PVs are translated to CSI")]
    NotLocal {
        /// The PV.
        pv: String,
    },
    /// The PV has more than one volume source.
    #[error("PV {pv} has more than one volume source ({}); a PV must have exactly one: remove all but one before migrating it", .sources.join(", "))]
    TwoSources {
        /// The PV.
        pv: String,
        /// The `spec` fields that are set, e.g. `local`, `hostPath`.
        sources: Vec<String>,
    },
    /// The local PV has no required node affinity terms.
    #[error("PV {pv} is a local PV without spec.nodeAffinity.required terms, which Kubernetes does not accept; add a `{HOSTNAME_KEY} In [<node>]` expression naming the node that holds the path")]
    NoNodeAffinity {
        /// The PV.
        pv: String,
    },
    /// No `kubernetes.io/hostname In` expression names the node.
    #[error("PV {pv} has no `{HOSTNAME_KEY} In [<node>]` node affinity expression, so the node holding its local path is unknown; add one naming that node")]
    NoHostname {
        /// The PV.
        pv: String,
    },
    /// The `kubernetes.io/hostname In` expressions do not name exactly one node.
    #[error("PV {pv} does not name exactly one node with `{HOSTNAME_KEY} In` (found [{}]); a local volume lives on one node: name that node alone in every such expression", .nodes.join(", "))]
    AmbiguousNode {
        /// The PV.
        pv: String,
        /// The values found (none, or more than one distinct).
        nodes: Vec<String>,
    },
    /// The node named is not a valid label value.
    #[error("PV {pv} names node {node:?} with {HOSTNAME_KEY}, which is not a valid label value (1 to 63 of [A-Za-z0-9-_.], alphanumeric at both ends); fix the node affinity")]
    BadNodeName {
        /// The PV.
        pv: String,
        /// The value found.
        node: String,
    },
    /// The local path is not acceptable.
    #[error("PV {pv} has local path {path:?}: {problem}; it must be the absolute path of the directory or device on the node")]
    BadPath {
        /// The PV.
        pv: String,
        /// The path found.
        path: String,
        /// What is wrong with it.
        problem: PathProblem,
    },
    /// The volume attributes would exceed the CSI limit.
    #[error("PV {pv} would need {bytes} bytes of CSI volume attributes, over the {MAX_ATTRIBUTE_BYTES} CSI allows; its local path is too long to migrate: shorten it")]
    TooLarge {
        /// The PV.
        pv: String,
        /// The size the attributes would have.
        bytes: usize,
    },
    /// The PV has no `spec.csi` source.
    #[error("PV {pv} has no spec.csi source; only CSI PVs are translated back to {IN_TREE_PLUGIN}")]
    NotCsi {
        /// The PV.
        pv: String,
    },
    /// The CSI PV belongs to another driver.
    #[error("PV {pv} belongs to CSI driver {driver}, not {expected}; only this driver's PVs are translated back (check driver.name)")]
    OtherDriver {
        /// The PV.
        pv: String,
        /// Its `csi.driver`.
        driver: String,
        /// This translator's driver.
        expected: String,
    },
    /// The CSI PV was not made by translation.
    #[error("PV {pv} is a CSI volume that was not translated from {IN_TREE_PLUGIN} (it has no {ATTR_MIGRATED_FROM} volume attribute); it has no in-tree form and stays a CSI volume")]
    NotTranslated {
        /// The PV.
        pv: String,
    },
    /// The CSI PV says it was translated, but its record is missing or inconsistent.
    #[error("PV {pv} says it was translated from {IN_TREE_PLUGIN} but {problem}; translating it back would lose or invent data: restore the attribute or the field as translation wrote it")]
    BadRecord {
        /// The PV.
        pv: String,
        /// What does not agree, in plain words.
        problem: String,
    },
}

/// Where a translated volume came from: what adopting it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LocalOrigin {
    /// The node holding the path.
    pub node: String,
    /// The in-tree `local.path`.
    pub path: String,
    /// The in-tree `local.fsType`, as it was (`None`: not set).
    pub fs_type: Option<String>,
    /// The CSI volume handle.
    pub volume_handle: String,
}

/// Translates `kubernetes.io/local-volume` PVs to drivelet CSI PVs and back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Translator {
    driver: String,
    topology_key: String,
    enabled: bool,
}

impl Translator {
    /// A translator for CSI driver `driver`, with drivelet's topology key; `enabled` is
    /// the per-plugin switch (`migration.local`).
    pub(crate) fn new(driver: impl Into<String>, enabled: bool) -> Self {
        Self { driver: driver.into(), topology_key: crate::TOPOLOGY_NODE_KEY.to_string(), enabled }
    }

    /// The translator a configuration asks for: `driver.name` and `migration.local`.
    pub(crate) fn from_config(cfg: &crate::config::Config) -> Self {
        Self::new(cfg.driver.name.clone(), cfg.migration.local)
    }

    #[cfg(test)]
    /// The CSI driver translated PVs name.
    pub(crate) fn driver(&self) -> &str {
        &self.driver
    }

    #[cfg(test)]
    /// The node topology key translated node affinity uses.
    pub(crate) fn topology_key(&self) -> &str {
        &self.topology_key
    }

    #[cfg(test)]
    /// The in-tree plugin this translator handles: [`IN_TREE_PLUGIN`].
    pub(crate) fn in_tree_plugin_name(&self) -> &'static str {
        IN_TREE_PLUGIN
    }

    /// Whether volumes of `plugin_name` are migrated: only `kubernetes.io/local-volume`,
    /// and only with the switch on.
    pub(crate) fn is_migrated(&self, plugin_name: &str) -> bool {
        self.enabled && plugin_name == IN_TREE_PLUGIN
    }

    #[cfg(test)]
    /// Whether `pv` is a volume of the in-tree plugin (`spec.local` is set). It does not
    /// say the translation will succeed: that is [`Translator::translate_to_csi`]'s to
    /// decide.
    pub(crate) fn can_support(&self, pv: &PersistentVolume) -> bool {
        pv.spec.as_ref().is_some_and(|s| s.local.is_some())
    }

    /// The CSI form of an in-tree local PV (see the module rules); `pv` is not changed.
    pub(crate) fn translate_to_csi(&self, pv: &PersistentVolume) -> Result<PersistentVolume, TranslateError> {
        let name = pv_name(pv)?;
        let (spec, local) = match pv.spec.as_ref() {
            Some(spec) => match spec.local.as_ref() {
                Some(local) => (spec, local),
                None => return Err(TranslateError::NotLocal { pv: name.into() }),
            },
            None => return Err(TranslateError::NotLocal { pv: name.into() }),
        };
        check_sources(name, spec)?;
        check_path(&local.path)
            .map_err(|problem| TranslateError::BadPath { pv: name.into(), path: local.path.clone(), problem })?;
        let node = node_of(pv)?;

        let mut spec = spec.clone();
        let rewritten = rewrite_hostname_keys(&mut spec, &self.topology_key);
        let mut attributes = BTreeMap::from([
            (ATTR_MIGRATED_FROM.to_string(), IN_TREE_PLUGIN.to_string()),
            (ATTR_NODE.to_string(), node.clone()),
            (ATTR_LOCAL_PATH.to_string(), local.path.clone()),
            (ATTR_HOSTNAME_EXPRESSIONS.to_string(), format_positions(&rewritten)),
        ]);
        if let Some(fs) = &local.fs_type {
            attributes.insert(ATTR_LOCAL_FSTYPE.to_string(), fs.clone());
        }
        let bytes = attribute_bytes(&attributes);
        if bytes > MAX_ATTRIBUTE_BYTES {
            return Err(TranslateError::TooLarge { pv: name.into(), bytes });
        }
        spec.local = None;
        spec.csi = Some(CSIPersistentVolumeSource {
            driver: self.driver.clone(),
            volume_handle: volume_handle(&node, name),
            fs_type: local.fs_type.clone().filter(|fs| !fs.is_empty()),
            volume_attributes: Some(attributes),
            ..Default::default()
        });
        Ok(PersistentVolume { metadata: pv.metadata.clone(), spec: Some(spec), status: pv.status.clone() })
    }

    #[cfg(test)]
    /// The in-tree form of a CSI PV made by [`Translator::translate_to_csi`]: its exact
    /// inverse. `pv` is not changed.
    pub(crate) fn translate_to_in_tree(&self, pv: &PersistentVolume) -> Result<PersistentVolume, TranslateError> {
        self.untranslate(pv).map(|(in_tree, _)| in_tree)
    }

    /// Where a translated CSI PV came from: node, path, fsType and handle, after the same
    /// checks as [`Translator::translate_to_in_tree`].
    pub(crate) fn local_origin(&self, pv: &PersistentVolume) -> Result<LocalOrigin, TranslateError> {
        self.untranslate(pv).map(|(_, origin)| origin)
    }

    fn untranslate(&self, pv: &PersistentVolume) -> Result<(PersistentVolume, LocalOrigin), TranslateError> {
        let name = pv_name(pv)?;
        let (spec, csi) = match pv.spec.as_ref() {
            Some(spec) => match spec.csi.as_ref() {
                Some(csi) => (spec, csi),
                None => return Err(TranslateError::NotCsi { pv: name.into() }),
            },
            None => return Err(TranslateError::NotCsi { pv: name.into() }),
        };
        check_sources(name, spec)?;
        if csi.driver != self.driver {
            return Err(TranslateError::OtherDriver {
                pv: name.into(),
                driver: csi.driver.clone(),
                expected: self.driver.clone(),
            });
        }
        let empty = BTreeMap::new();
        let attributes = csi.volume_attributes.as_ref().unwrap_or(&empty);
        let bad = |problem: String| TranslateError::BadRecord { pv: name.into(), problem };
        match attributes.get(ATTR_MIGRATED_FROM) {
            None => return Err(TranslateError::NotTranslated { pv: name.into() }),
            Some(from) if from != IN_TREE_PLUGIN => {
                return Err(bad(format!("its {ATTR_MIGRATED_FROM} attribute is {from:?}, not {IN_TREE_PLUGIN:?}")))
            }
            Some(_) => {}
        }
        if let Some(unknown) = attributes.keys().find(|k| !ATTRIBUTES.contains(&k.as_str())) {
            return Err(bad(format!("it has volume attribute {unknown:?}, which an in-tree local PV cannot hold")));
        }
        let required = |key: &str| attributes.get(key).ok_or_else(|| bad(format!("its {key} volume attribute is missing")));
        let path = required(ATTR_LOCAL_PATH)?.clone();
        let node = required(ATTR_NODE)?.clone();
        let positions = parse_positions(required(ATTR_HOSTNAME_EXPRESSIONS)?)
            .ok_or_else(|| bad(format!("its {ATTR_HOSTNAME_EXPRESSIONS} volume attribute is not a list of <term>.<expression> positions")))?;
        let fs_type = attributes.get(ATTR_LOCAL_FSTYPE).cloned();
        check_path(&path).map_err(|problem| TranslateError::BadPath { pv: name.into(), path: path.clone(), problem })?;
        let expected_handle = volume_handle(&node, name);
        if csi.volume_handle != expected_handle {
            return Err(bad(format!(
                "its volumeHandle {:?} is not {expected_handle:?}, the handle of node {node:?} and this PV name",
                csi.volume_handle
            )));
        }
        if csi.fs_type != fs_type.clone().filter(|fs| !fs.is_empty()) {
            return Err(bad(format!("its csi.fsType {:?} differs from the recorded local fsType {fs_type:?}", csi.fs_type)));
        }
        for (field, set) in [
            ("readOnly", csi.read_only.is_some()),
            ("controllerPublishSecretRef", csi.controller_publish_secret_ref.is_some()),
            ("controllerExpandSecretRef", csi.controller_expand_secret_ref.is_some()),
            ("nodeStageSecretRef", csi.node_stage_secret_ref.is_some()),
            ("nodePublishSecretRef", csi.node_publish_secret_ref.is_some()),
            ("nodeExpandSecretRef", csi.node_expand_secret_ref.is_some()),
        ] {
            if set {
                return Err(bad(format!("it sets csi.{field}, which an in-tree local PV cannot hold")));
            }
        }

        let mut spec = spec.clone();
        restore_hostname_keys(&mut spec, &positions, &self.topology_key).map_err(bad)?;
        spec.csi = None;
        spec.local = Some(LocalVolumeSource { path: path.clone(), fs_type: fs_type.clone() });
        let in_tree = PersistentVolume { metadata: pv.metadata.clone(), spec: Some(spec), status: pv.status.clone() };
        let affinity_node = node_of(&in_tree).map_err(|e| bad(format!("its node affinity, restored, is not valid: {e}")))?;
        if affinity_node != node {
            return Err(bad(format!("its node affinity names node {affinity_node:?} but {ATTR_NODE} says {node:?}")));
        }
        let origin = LocalOrigin { node, path, fs_type, volume_handle: expected_handle };
        Ok((in_tree, origin))
    }
}

/// The volume handle of the local PV `pv_name` on `node`:
/// `local-<UUID v5 of "<node>/<pv_name>" in HANDLE_NAMESPACE>`.
pub(crate) fn volume_handle(node: &str, pv_name: &str) -> String {
    let id = Uuid::new_v5(&HANDLE_NAMESPACE, format!("{node}/{pv_name}").as_bytes());
    format!("{HANDLE_PREFIX}{id}")
}

/// The node an in-tree local PV lives on: the one value of its
/// `kubernetes.io/hostname In` node affinity expressions (see the module rules).
pub(crate) fn node_of(pv: &PersistentVolume) -> Result<String, TranslateError> {
    let name = pv_name(pv)?;
    let terms = terms(pv);
    if terms.is_empty() {
        return Err(TranslateError::NoNodeAffinity { pv: name.into() });
    }
    let mut nodes = BTreeSet::new();
    let mut found = false;
    for expr in terms.iter().flat_map(|t| t.match_expressions.iter().flatten()) {
        if expr.key != HOSTNAME_KEY || expr.operator != "In" {
            continue;
        }
        found = true;
        let values = expr.values.clone().unwrap_or_default();
        if values.len() != 1 {
            return Err(TranslateError::AmbiguousNode { pv: name.into(), nodes: values });
        }
        nodes.extend(values);
    }
    if !found {
        return Err(TranslateError::NoHostname { pv: name.into() });
    }
    let mut nodes = nodes.into_iter();
    match (nodes.next(), nodes.next()) {
        (Some(node), None) if valid_label_value(&node) => Ok(node),
        (Some(node), None) => Err(TranslateError::BadNodeName { pv: name.into(), node }),
        (first, second) => Err(TranslateError::AmbiguousNode {
            pv: name.into(),
            nodes: first.into_iter().chain(second).chain(nodes).collect(),
        }),
    }
}

/// Checks a local path: non-empty, absolute, no NUL, no `..` component.
pub(crate) fn check_path(path: &str) -> Result<(), PathProblem> {
    if path.is_empty() {
        return Err(PathProblem::Empty);
    }
    if path.contains('\0') {
        return Err(PathProblem::Nul);
    }
    if !path.starts_with('/') {
        return Err(PathProblem::Relative);
    }
    if path.split('/').any(|c| c == "..") {
        return Err(PathProblem::DotDot);
    }
    Ok(())
}

fn pv_name(pv: &PersistentVolume) -> Result<&str, TranslateError> {
    match pv.metadata.name.as_deref() {
        Some(name) if !name.is_empty() => Ok(name),
        _ => Err(TranslateError::Unnamed),
    }
}

fn terms(pv: &PersistentVolume) -> &[NodeSelectorTerm] {
    pv.spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map_or(&[], |r| r.node_selector_terms.as_slice())
}

/// The volume sources set on a spec, by their API field names.
fn sources(spec: &PersistentVolumeSpec) -> Vec<String> {
    let set = [
        ("awsElasticBlockStore", spec.aws_elastic_block_store.is_some()),
        ("azureDisk", spec.azure_disk.is_some()),
        ("azureFile", spec.azure_file.is_some()),
        ("cephfs", spec.cephfs.is_some()),
        ("cinder", spec.cinder.is_some()),
        ("csi", spec.csi.is_some()),
        ("fc", spec.fc.is_some()),
        ("flexVolume", spec.flex_volume.is_some()),
        ("flocker", spec.flocker.is_some()),
        ("gcePersistentDisk", spec.gce_persistent_disk.is_some()),
        ("glusterfs", spec.glusterfs.is_some()),
        ("hostPath", spec.host_path.is_some()),
        ("iscsi", spec.iscsi.is_some()),
        ("local", spec.local.is_some()),
        ("nfs", spec.nfs.is_some()),
        ("photonPersistentDisk", spec.photon_persistent_disk.is_some()),
        ("portworxVolume", spec.portworx_volume.is_some()),
        ("quobyte", spec.quobyte.is_some()),
        ("rbd", spec.rbd.is_some()),
        ("scaleIO", spec.scale_io.is_some()),
        ("storageos", spec.storageos.is_some()),
        ("vsphereVolume", spec.vsphere_volume.is_some()),
    ];
    set.into_iter().filter(|(_, on)| *on).map(|(field, _)| field.to_string()).collect()
}

fn check_sources(pv: &str, spec: &PersistentVolumeSpec) -> Result<(), TranslateError> {
    let sources = sources(spec);
    if sources.len() > 1 {
        return Err(TranslateError::TwoSources { pv: pv.into(), sources });
    }
    Ok(())
}

/// Gives every `kubernetes.io/hostname` match expression the key `to`; returns their
/// positions (term, expression) in ascending order.
fn rewrite_hostname_keys(spec: &mut PersistentVolumeSpec, to: &str) -> Vec<(usize, usize)> {
    let mut rewritten = Vec::new();
    let terms = spec.node_affinity.as_mut().and_then(|a| a.required.as_mut()).map(|r| &mut r.node_selector_terms);
    for (t, term) in terms.into_iter().flatten().enumerate() {
        for (e, expr) in term.match_expressions.iter_mut().flatten().enumerate() {
            if expr.key == HOSTNAME_KEY {
                expr.key = to.to_string();
                rewritten.push((t, e));
            }
        }
    }
    rewritten
}

/// Gives the expressions at `positions`, which must carry the key `from`, the key
/// `kubernetes.io/hostname` back.
fn restore_hostname_keys(spec: &mut PersistentVolumeSpec, positions: &[(usize, usize)], from: &str) -> Result<(), String> {
    let terms = spec.node_affinity.as_mut().and_then(|a| a.required.as_mut()).map(|r| &mut r.node_selector_terms);
    let Some(terms) = terms else {
        if positions.is_empty() {
            return Ok(());
        }
        return Err(format!("its {ATTR_HOSTNAME_EXPRESSIONS} attribute names expressions but it has no node affinity terms"));
    };
    for &(t, e) in positions {
        let expr = terms.get_mut(t).and_then(|term| term.match_expressions.as_mut()).and_then(|exprs| exprs.get_mut(e));
        match expr {
            Some(expr) if expr.key == from => expr.key = HOSTNAME_KEY.to_string(),
            Some(expr) => {
                return Err(format!("node affinity expression {t}.{e} has key {:?}, where translation wrote {from:?}", expr.key))
            }
            None => return Err(format!("node affinity expression {t}.{e}, named by {ATTR_HOSTNAME_EXPRESSIONS}, does not exist")),
        }
    }
    Ok(())
}

fn format_positions(positions: &[(usize, usize)]) -> String {
    positions.iter().map(|(t, e)| format!("{t}.{e}")).collect::<Vec<_>>().join(",")
}

/// Parses `format_positions` output; `None` unless well formed and strictly ascending.
fn parse_positions(s: &str) -> Option<Vec<(usize, usize)>> {
    if s.is_empty() {
        return Some(Vec::new());
    }
    let positions = s
        .split(',')
        .map(|p| {
            let (t, e) = p.split_once('.')?;
            let digits = |x: &str| !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit());
            if !digits(t) || !digits(e) {
                return None;
            }
            Some((t.parse().ok()?, e.parse().ok()?))
        })
        .collect::<Option<Vec<(usize, usize)>>>()?;
    positions.windows(2).all(|w| w[0] < w[1]).then_some(positions)
}

fn attribute_bytes(attributes: &BTreeMap<String, String>) -> usize {
    attributes.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// A Kubernetes label value, non-empty: 1 to 63 of `[A-Za-z0-9-_.]`, alphanumeric at both
/// ends.
fn valid_label_value(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 63
        && v.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && v.starts_with(|c: char| c.is_ascii_alphanumeric())
        && v.ends_with(|c: char| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests;
