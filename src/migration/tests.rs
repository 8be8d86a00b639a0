use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, NodeSelector, NodeSelectorRequirement, ObjectReference, PersistentVolumeStatus,
    SecretReference, VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;

use super::*;

const DRIVER: &str = "csi.drivelet.io";

fn translator() -> Translator {
    Translator::new(DRIVER, true)
}

fn expr(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.into(),
        operator: operator.into(),
        values: Some(values.iter().map(|v| v.to_string()).collect()),
    }
}

fn term(exprs: Vec<NodeSelectorRequirement>) -> NodeSelectorTerm {
    NodeSelectorTerm { match_expressions: Some(exprs), match_fields: None }
}

fn affinity(terms: Vec<NodeSelectorTerm>) -> Option<VolumeNodeAffinity> {
    Some(VolumeNodeAffinity { required: Some(NodeSelector { node_selector_terms: terms }) })
}

fn local_pv(name: &str, node: &str, path: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            capacity: Some(BTreeMap::from([("storage".into(), Quantity("10Gi".into()))])),
            local: Some(LocalVolumeSource { path: path.into(), fs_type: None }),
            node_affinity: affinity(vec![term(vec![expr(HOSTNAME_KEY, "In", &[node])])]),
            ..Default::default()
        }),
        status: None,
    }
}

fn spec_mut(pv: &mut PersistentVolume) -> &mut PersistentVolumeSpec {
    pv.spec.get_or_insert_with(Default::default)
}

fn terms_mut(pv: &mut PersistentVolume) -> &mut Vec<NodeSelectorTerm> {
    &mut spec_mut(pv).node_affinity.as_mut().unwrap().required.as_mut().unwrap().node_selector_terms
}

fn csi_of(pv: &PersistentVolume) -> &CSIPersistentVolumeSource {
    pv.spec.as_ref().unwrap().csi.as_ref().unwrap()
}

fn csi_mut(pv: &mut PersistentVolume) -> &mut CSIPersistentVolumeSource {
    spec_mut(pv).csi.as_mut().unwrap()
}

fn attrs_mut(pv: &mut PersistentVolume) -> &mut BTreeMap<String, String> {
    csi_mut(pv).volume_attributes.as_mut().unwrap()
}

fn fixture(file: &str) -> PersistentVolume {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pv").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn attributes(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// The spec without the fields translation may change, to compare the rest.
fn untouched_part(pv: &PersistentVolume) -> PersistentVolumeSpec {
    let mut spec = pv.spec.clone().unwrap();
    spec.local = None;
    spec.csi = None;
    spec.node_affinity = None;
    spec
}

// ---- fixtures ----

#[test]
fn static_provisioner_pv_translates_field_by_field_and_back() {
    let pv = fixture("local-static-provisioner.yaml");
    let csi_pv = translator().translate_to_csi(&pv).unwrap();

    let csi = csi_of(&csi_pv);
    assert_eq!(csi.driver, DRIVER);
    assert_eq!(csi.volume_handle, "local-c69c78ec-81b6-5fc1-8505-4e5e5357d8a2");
    assert_eq!(csi.fs_type, None);
    assert_eq!(csi.read_only, None);
    assert_eq!(
        csi.volume_attributes.as_ref().unwrap(),
        &attributes(&[
            (ATTR_MIGRATED_FROM, IN_TREE_PLUGIN),
            (ATTR_NODE, "worker-2"),
            (ATTR_LOCAL_PATH, "/mnt/fast-disks/nvme0n1"),
            (ATTR_HOSTNAME_EXPRESSIONS, "0.0"),
        ])
    );
    let spec = csi_pv.spec.as_ref().unwrap();
    assert_eq!(spec.local, None);
    assert_eq!(
        spec.node_affinity,
        affinity(vec![term(vec![expr(crate::TOPOLOGY_NODE_KEY, "In", &["worker-2"])])])
    );
    assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    assert_eq!(spec.storage_class_name.as_deref(), Some("fast-disks"));
    assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Delete"));
    assert_eq!(spec.claim_ref.as_ref().unwrap().name.as_deref(), Some("data-postgres-0"));
    assert_eq!(spec.capacity.as_ref().unwrap()["storage"], Quantity("368Gi".into()));
    assert_eq!(untouched_part(&csi_pv), untouched_part(&pv));
    assert_eq!(csi_pv.metadata, pv.metadata);
    assert_eq!(csi_pv.status, pv.status);

    assert_eq!(translator().translate_to_in_tree(&csi_pv).unwrap(), pv);
}

#[test]
fn zone_expression_is_kept_and_only_the_hostname_expression_is_rewritten() {
    let pv = fixture("zone-and-hostname.yaml");
    let csi_pv = translator().translate_to_csi(&pv).unwrap();

    let csi = csi_of(&csi_pv);
    assert_eq!(csi.volume_handle, "local-6a57e1bd-8964-532d-bdd2-fd92d463665e");
    assert_eq!(csi.fs_type.as_deref(), Some("ext4"));
    assert_eq!(
        csi.volume_attributes.as_ref().unwrap(),
        &attributes(&[
            (ATTR_MIGRATED_FROM, IN_TREE_PLUGIN),
            (ATTR_NODE, "gke-prod-pool-1-3f2a9c7d-x8kq"),
            (ATTR_LOCAL_PATH, "/mnt/disks/ssd1"),
            (ATTR_LOCAL_FSTYPE, "ext4"),
            (ATTR_HOSTNAME_EXPRESSIONS, "0.1"),
        ])
    );
    assert_eq!(
        csi_pv.spec.as_ref().unwrap().node_affinity,
        affinity(vec![term(vec![
            expr("topology.kubernetes.io/zone", "In", &["europe-west1-b"]),
            expr(crate::TOPOLOGY_NODE_KEY, "In", &["gke-prod-pool-1-3f2a9c7d-x8kq"]),
        ])])
    );
    assert_eq!(csi_pv.spec.as_ref().unwrap().mount_options, Some(vec!["noatime".to_string()]));
    assert_eq!(untouched_part(&csi_pv), untouched_part(&pv));
    assert_eq!(csi_pv.metadata, pv.metadata);

    assert_eq!(translator().translate_to_in_tree(&csi_pv).unwrap(), pv);
}

#[test]
fn block_mode_pv_keeps_its_device_path_and_volume_mode() {
    let pv = fixture("block-mode.yaml");
    let csi_pv = translator().translate_to_csi(&pv).unwrap();

    let csi = csi_of(&csi_pv);
    assert_eq!(csi.volume_handle, "local-bcd7137f-6dd9-5185-a364-3c6498ca2288");
    assert_eq!(csi.fs_type, None);
    let attrs = csi.volume_attributes.as_ref().unwrap();
    assert_eq!(attrs[ATTR_LOCAL_PATH], "/dev/disk/by-id/nvme-SAMSUNG_MZQL21T9HCJR-00A07_S64GNE0T512345");
    assert_eq!(attrs[ATTR_NODE], "storage-07");
    assert!(!attrs.contains_key(ATTR_LOCAL_FSTYPE));
    assert_eq!(csi_pv.spec.as_ref().unwrap().volume_mode.as_deref(), Some("Block"));
    assert_eq!(csi_pv.status.as_ref().unwrap().phase.as_deref(), Some("Released"));
    assert_eq!(untouched_part(&csi_pv), untouched_part(&pv));

    assert_eq!(translator().translate_to_in_tree(&csi_pv).unwrap(), pv);
}

#[test]
fn pv_already_using_drivelets_key_round_trips_exactly() {
    let pv = fixture("drivelet-key-already-present.yaml");
    let csi_pv = translator().translate_to_csi(&pv).unwrap();

    let attrs = csi_of(&csi_pv).volume_attributes.as_ref().unwrap();
    assert_eq!(attrs[ATTR_HOSTNAME_EXPRESSIONS], "0.1,1.0");
    assert_eq!(attrs[ATTR_LOCAL_FSTYPE], "xfs");
    assert_eq!(
        csi_pv.spec.as_ref().unwrap().node_affinity,
        affinity(vec![
            term(vec![
                expr(crate::TOPOLOGY_NODE_KEY, "In", &["node-b"]),
                expr(crate::TOPOLOGY_NODE_KEY, "In", &["node-b"]),
            ]),
            term(vec![
                expr(crate::TOPOLOGY_NODE_KEY, "In", &["node-b"]),
                NodeSelectorRequirement {
                    key: "node-role.kubernetes.io/storage".into(),
                    operator: "Exists".into(),
                    values: None
                },
            ]),
        ])
    );

    assert_eq!(translator().translate_to_in_tree(&csi_pv).unwrap(), pv);
}

#[test]
fn every_fixture_round_trips_through_yaml() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pv");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let file = entry.unwrap().file_name().into_string().unwrap();
        let pv = fixture(&file);
        let csi_yaml = serde_norway::to_string(&translator().translate_to_csi(&pv).unwrap()).unwrap();
        let csi_pv: PersistentVolume = serde_norway::from_str(&csi_yaml).unwrap();
        assert_eq!(translator().translate_to_in_tree(&csi_pv).unwrap(), pv, "{file}");
        seen += 1;
    }
    assert!(seen >= 4, "fixtures missing in {}", dir.display());
}

#[test]
fn local_origin_gives_node_path_fstype_and_handle_of_a_translated_pv() {
    let csi_pv = translator().translate_to_csi(&fixture("zone-and-hostname.yaml")).unwrap();
    assert_eq!(
        translator().local_origin(&csi_pv).unwrap(),
        LocalOrigin {
            node: "gke-prod-pool-1-3f2a9c7d-x8kq".into(),
            path: "/mnt/disks/ssd1".into(),
            fs_type: Some("ext4".into()),
            volume_handle: "local-6a57e1bd-8964-532d-bdd2-fd92d463665e".into(),
        }
    );
    let block = translator().translate_to_csi(&fixture("block-mode.yaml")).unwrap();
    assert_eq!(translator().local_origin(&block).unwrap().fs_type, None);
}

#[test]
fn empty_fstype_is_recorded_apart_from_no_fstype() {
    let mut pv = local_pv("pv-1", "node-1", "/mnt/disks/a");
    spec_mut(&mut pv).local.as_mut().unwrap().fs_type = Some(String::new());
    let csi_pv = translator().translate_to_csi(&pv).unwrap();
    assert_eq!(csi_of(&csi_pv).fs_type, None);
    assert_eq!(csi_of(&csi_pv).volume_attributes.as_ref().unwrap()[ATTR_LOCAL_FSTYPE], "");
    assert_eq!(translator().translate_to_in_tree(&csi_pv).unwrap(), pv);
}

// ---- switches and support ----

#[test]
fn only_the_local_plugin_is_migrated_and_only_with_its_switch_on() {
    let on = Translator::new(DRIVER, true);
    let off = Translator::new(DRIVER, false);
    assert!(on.is_migrated(IN_TREE_PLUGIN));
    assert!(!off.is_migrated(IN_TREE_PLUGIN));
    for other in ["kubernetes.io/host-path", "kubernetes.io/gce-pd", "kubernetes.io/csi", "", "local"] {
        assert!(!on.is_migrated(other), "{other}");
    }
    assert_eq!(on.in_tree_plugin_name(), IN_TREE_PLUGIN);
}

#[test]
fn config_gives_the_driver_name_and_the_local_switch() {
    let mut cfg = crate::config::Config::default();
    let t = Translator::from_config(&cfg);
    assert_eq!(t.driver(), "csi.drivelet.io");
    assert_eq!(t.topology_key(), crate::TOPOLOGY_NODE_KEY);
    assert!(!t.is_migrated(IN_TREE_PLUGIN));
    cfg.migration.local = true;
    cfg.driver.name = "x.example.com".into();
    let t = Translator::from_config(&cfg);
    assert!(t.is_migrated(IN_TREE_PLUGIN));
    assert_eq!(t.driver(), "x.example.com");
}

#[test]
fn translation_works_with_the_switch_off_because_the_caller_consults_it() {
    let off = Translator::new(DRIVER, false);
    let pv = local_pv("pv-1", "node-1", "/mnt/disks/a");
    let csi_pv = off.translate_to_csi(&pv).unwrap();
    assert_eq!(off.translate_to_in_tree(&csi_pv).unwrap(), pv);
}

#[test]
fn can_support_is_true_for_local_pvs_only() {
    let t = translator();
    let pv = local_pv("pv-1", "node-1", "/mnt/disks/a");
    assert!(t.can_support(&pv));
    assert!(!t.can_support(&t.translate_to_csi(&pv).unwrap()));
    assert!(!t.can_support(&PersistentVolume::default()));
}

#[test]
fn node_of_ignores_hostname_expressions_that_name_no_node() {
    let mut pv = local_pv("pv-1", "node-1", "/mnt/disks/a");
    terms_mut(&mut pv)[0].match_expressions.as_mut().unwrap().push(expr(HOSTNAME_KEY, "NotIn", &["node-2", "node-3"]));
    terms_mut(&mut pv).push(term(vec![expr(HOSTNAME_KEY, "In", &["node-1"])]));
    assert_eq!(node_of(&pv).unwrap(), "node-1");
    assert_eq!(node_of(&fixture("zone-and-hostname.yaml")).unwrap(), "gke-prod-pool-1-3f2a9c7d-x8kq");
}

#[test]
fn paths_with_dots_that_are_not_parent_components_are_accepted() {
    for path in ["/", "/mnt/..hidden", "/mnt/a..b", "/mnt/./a", "/mnt//a/", "/dev/disk/by-path/pci-0000:00:1f.2-ata-1"] {
        assert_eq!(check_path(path), Ok(()), "{path}");
    }
}

// ---- determinism ----

#[test]
fn same_pv_always_gets_the_same_volume_handle() {
    // Pinned: changing the scheme would give every migrated volume a new identity.
    assert_eq!(HANDLE_NAMESPACE.to_string(), "773688ae-0314-42ef-8231-28a8c6dcb3c8");
    assert_eq!(volume_handle("node-1", "local-pv-1"), "local-8322f736-0957-5010-86fb-c71939f6aa7c");
    let pv = local_pv("local-pv-1", "node-1", "/mnt/disks/a");
    let first = translator().translate_to_csi(&pv).unwrap();
    let second = translator().translate_to_csi(&pv.clone()).unwrap();
    assert_eq!(first, second);
    assert_eq!(csi_of(&first).volume_handle, "local-8322f736-0957-5010-86fb-c71939f6aa7c");
}

#[test]
fn pvs_differing_only_by_name_or_node_get_different_handles() {
    let handle = |name: &str, node: &str| {
        csi_of(&translator().translate_to_csi(&local_pv(name, node, "/mnt/disks/a")).unwrap()).volume_handle.clone()
    };
    let base = handle("pv-1", "node-1");
    assert_ne!(base, handle("pv-2", "node-1"));
    assert_ne!(base, handle("pv-1", "node-2"));
    // The separator cannot be shifted between the parts: neither may contain '/'.
    assert_ne!(volume_handle("a.b", "c"), volume_handle("a", "b.c"));
    // The path is not part of the identity.
    assert_eq!(base, csi_of(&translator().translate_to_csi(&local_pv("pv-1", "node-1", "/elsewhere")).unwrap()).volume_handle);
}

// ---- errors: in-tree to CSI ----

type Mutation = Box<dyn Fn(&mut PersistentVolume)>;

#[test]
fn in_tree_pvs_that_cannot_be_translated_are_refused_with_the_reason() {
    let pv = |s: &str| s.to_string();
    let bad_path = |path: &str, problem| TranslateError::BadPath { pv: pv("pv-1"), path: path.into(), problem };
    let set_path = |path: &'static str| -> Mutation { Box::new(move |p| spec_mut(p).local.as_mut().unwrap().path = path.into()) };
    let set_hostname = |values: &'static [&'static str]| -> Mutation {
        Box::new(move |p| terms_mut(p)[0] = term(vec![expr(HOSTNAME_KEY, "In", values)]))
    };
    let cases: Vec<(&str, Mutation, TranslateError)> = vec![
        ("no name", Box::new(|p| p.metadata.name = None), TranslateError::Unnamed),
        ("empty name", Box::new(|p| p.metadata.name = Some(String::new())), TranslateError::Unnamed),
        ("no spec", Box::new(|p| p.spec = None), TranslateError::NotLocal { pv: pv("pv-1") }),
        (
            "hostPath instead of local",
            Box::new(|p| {
                spec_mut(p).local = None;
                spec_mut(p).host_path = Some(HostPathVolumeSource { path: "/data".into(), type_: None });
            }),
            TranslateError::NotLocal { pv: pv("pv-1") },
        ),
        (
            "local and hostPath",
            Box::new(|p| spec_mut(p).host_path = Some(HostPathVolumeSource { path: "/data".into(), type_: None })),
            TranslateError::TwoSources { pv: pv("pv-1"), sources: vec![pv("hostPath"), pv("local")] },
        ),
        (
            "local and csi",
            Box::new(|p| {
                spec_mut(p).csi =
                    Some(CSIPersistentVolumeSource { driver: DRIVER.into(), volume_handle: "v".into(), ..Default::default() })
            }),
            TranslateError::TwoSources { pv: pv("pv-1"), sources: vec![pv("csi"), pv("local")] },
        ),
        ("no node affinity", Box::new(|p| spec_mut(p).node_affinity = None), TranslateError::NoNodeAffinity { pv: pv("pv-1") }),
        (
            "no required node affinity",
            Box::new(|p| spec_mut(p).node_affinity = Some(VolumeNodeAffinity { required: None })),
            TranslateError::NoNodeAffinity { pv: pv("pv-1") },
        ),
        ("no terms", Box::new(|p| terms_mut(p).clear()), TranslateError::NoNodeAffinity { pv: pv("pv-1") }),
        (
            "zone only",
            Box::new(|p| terms_mut(p)[0] = term(vec![expr("topology.kubernetes.io/zone", "In", &["zone-a"])])),
            TranslateError::NoHostname { pv: pv("pv-1") },
        ),
        (
            "hostname NotIn only",
            Box::new(|p| terms_mut(p)[0] = term(vec![expr(HOSTNAME_KEY, "NotIn", &["node-2"])])),
            TranslateError::NoHostname { pv: pv("pv-1") },
        ),
        (
            "hostname in match fields only",
            Box::new(|p| {
                terms_mut(p)[0] = NodeSelectorTerm {
                    match_expressions: None,
                    match_fields: Some(vec![expr("metadata.name", "In", &["node-1"])]),
                }
            }),
            TranslateError::NoHostname { pv: pv("pv-1") },
        ),
        (
            "two nodes in one expression",
            set_hostname(&["node-1", "node-2"]),
            TranslateError::AmbiguousNode { pv: pv("pv-1"), nodes: vec![pv("node-1"), pv("node-2")] },
        ),
        ("no value", set_hostname(&[]), TranslateError::AmbiguousNode { pv: pv("pv-1"), nodes: vec![] }),
        (
            "values absent",
            Box::new(|p| terms_mut(p)[0].match_expressions.as_mut().unwrap()[0].values = None),
            TranslateError::AmbiguousNode { pv: pv("pv-1"), nodes: vec![] },
        ),
        (
            "two terms naming different nodes",
            Box::new(|p| terms_mut(p).push(term(vec![expr(HOSTNAME_KEY, "In", &["node-2"])]))),
            TranslateError::AmbiguousNode { pv: pv("pv-1"), nodes: vec![pv("node-1"), pv("node-2")] },
        ),
        ("empty node name", set_hostname(&[""]), TranslateError::BadNodeName { pv: pv("pv-1"), node: pv("") }),
        ("node name with a slash", set_hostname(&["a/b"]), TranslateError::BadNodeName { pv: pv("pv-1"), node: pv("a/b") }),
        ("node name starting with a dash", set_hostname(&["-n"]), TranslateError::BadNodeName { pv: pv("pv-1"), node: pv("-n") }),
        ("empty path", set_path(""), bad_path("", PathProblem::Empty)),
        ("relative path", set_path("mnt/disks/a"), bad_path("mnt/disks/a", PathProblem::Relative)),
        ("parent component", set_path("/mnt/../etc"), bad_path("/mnt/../etc", PathProblem::DotDot)),
        ("trailing parent component", set_path("/mnt/disks/.."), bad_path("/mnt/disks/..", PathProblem::DotDot)),
        ("NUL in path", set_path("/mnt/a\0b"), bad_path("/mnt/a\0b", PathProblem::Nul)),
    ];
    let t = translator();
    for (what, mutate, want) in cases {
        let mut p = local_pv("pv-1", "node-1", "/mnt/disks/a");
        mutate(&mut p);
        let err = t.translate_to_csi(&p).expect_err(what);
        assert_eq!(err, want, "{what}");
        let msg = err.to_string();
        if want != TranslateError::Unnamed {
            assert!(msg.contains("pv-1"), "{what}: {msg} should name the PV");
        }
        assert!(msg.contains(';'), "{what}: {msg} should say what to do after what is wrong");
    }
}

#[test]
fn a_path_too_long_for_the_csi_attribute_limit_is_refused() {
    let path = format!("/{}", "d/".repeat(2100));
    let err = translator().translate_to_csi(&local_pv("pv-1", "node-1", &path)).unwrap_err();
    assert!(matches!(err, TranslateError::TooLarge { ref pv, bytes } if pv == "pv-1" && bytes > MAX_ATTRIBUTE_BYTES), "{err}");
    let fits = format!("/{}", "d/".repeat(1900));
    translator().translate_to_csi(&local_pv("pv-1", "node-1", &fits)).unwrap();
}

// ---- errors: CSI to in-tree ----

enum Want {
    Is(TranslateError),
    /// A `BadRecord` whose problem mentions this.
    Record(&'static str),
}

#[test]
fn csi_pvs_that_cannot_be_translated_back_are_refused_with_the_reason() {
    let pv = |s: &str| s.to_string();
    let cases: Vec<(&str, Mutation, Want)> = vec![
        ("no name", Box::new(|p| p.metadata.name = None), Want::Is(TranslateError::Unnamed)),
        ("no spec", Box::new(|p| p.spec = None), Want::Is(TranslateError::NotCsi { pv: pv("pv-1") })),
        ("in-tree PV", Box::new(|p| *p = local_pv("pv-1", "node-1", "/mnt/disks/a")), Want::Is(TranslateError::NotCsi { pv: pv("pv-1") })),
        (
            "csi and hostPath",
            Box::new(|p| spec_mut(p).host_path = Some(HostPathVolumeSource { path: "/data".into(), type_: None })),
            Want::Is(TranslateError::TwoSources { pv: pv("pv-1"), sources: vec![pv("csi"), pv("hostPath")] }),
        ),
        (
            "another driver",
            Box::new(|p| csi_mut(p).driver = "ebs.csi.aws.com".into()),
            Want::Is(TranslateError::OtherDriver { pv: pv("pv-1"), driver: pv("ebs.csi.aws.com"), expected: pv(DRIVER) }),
        ),
        (
            "drivelet's own volume",
            Box::new(|p| {
                *csi_mut(p) = CSIPersistentVolumeSource {
                    driver: DRIVER.into(),
                    volume_handle: "3148d51a-bb5a-497e-a7d1-3d6d10985865".into(),
                    fs_type: Some("ext4".into()),
                    volume_attributes: Some(BTreeMap::from([("media".into(), "nvme".into())])),
                    ..Default::default()
                }
            }),
            Want::Is(TranslateError::NotTranslated { pv: pv("pv-1") }),
        ),
        ("no attributes", Box::new(|p| csi_mut(p).volume_attributes = None), Want::Is(TranslateError::NotTranslated { pv: pv("pv-1") })),
        (
            "migrated from another plugin",
            Box::new(|p| {
                attrs_mut(p).insert(ATTR_MIGRATED_FROM.into(), "kubernetes.io/host-path".into());
            }),
            Want::Record("kubernetes.io/host-path"),
        ),
        (
            "unknown attribute",
            Box::new(|p| {
                attrs_mut(p).insert("media".into(), "nvme".into());
            }),
            Want::Record("\"media\""),
        ),
        (
            "no path attribute",
            Box::new(|p| {
                attrs_mut(p).remove(ATTR_LOCAL_PATH);
            }),
            Want::Record(ATTR_LOCAL_PATH),
        ),
        (
            "no node attribute",
            Box::new(|p| {
                attrs_mut(p).remove(ATTR_NODE);
            }),
            Want::Record(ATTR_NODE),
        ),
        (
            "no positions attribute",
            Box::new(|p| {
                attrs_mut(p).remove(ATTR_HOSTNAME_EXPRESSIONS);
            }),
            Want::Record(ATTR_HOSTNAME_EXPRESSIONS),
        ),
        (
            "malformed positions",
            Box::new(|p| {
                attrs_mut(p).insert(ATTR_HOSTNAME_EXPRESSIONS.into(), "0".into());
            }),
            Want::Record(ATTR_HOSTNAME_EXPRESSIONS),
        ),
        (
            "repeated positions",
            Box::new(|p| {
                attrs_mut(p).insert(ATTR_HOSTNAME_EXPRESSIONS.into(), "0.0,0.0".into());
            }),
            Want::Record(ATTR_HOSTNAME_EXPRESSIONS),
        ),
        (
            "signed position",
            Box::new(|p| {
                attrs_mut(p).insert(ATTR_HOSTNAME_EXPRESSIONS.into(), "+0.0".into());
            }),
            Want::Record(ATTR_HOSTNAME_EXPRESSIONS),
        ),
        (
            "position out of range",
            Box::new(|p| {
                attrs_mut(p).insert(ATTR_HOSTNAME_EXPRESSIONS.into(), "0.0,3.0".into());
            }),
            Want::Record("3.0"),
        ),
        (
            "position naming another key",
            Box::new(|p| terms_mut(p)[0].match_expressions.as_mut().unwrap()[0].key = "topology.kubernetes.io/zone".into()),
            Want::Record("topology.kubernetes.io/zone"),
        ),
        (
            "handle changed",
            Box::new(|p| csi_mut(p).volume_handle = "local-00000000-0000-0000-0000-000000000000".into()),
            Want::Record("volumeHandle"),
        ),
        (
            "node attribute naming another node",
            Box::new(|p| {
                attrs_mut(p).insert(ATTR_NODE.into(), "node-2".into());
                csi_mut(p).volume_handle = volume_handle("node-2", "pv-1");
            }),
            Want::Record("node-2"),
        ),
        (
            "csi fsType without a recorded fsType",
            Box::new(|p| csi_mut(p).fs_type = Some("xfs".into())),
            Want::Record("fsType"),
        ),
        (
            "read-only",
            Box::new(|p| csi_mut(p).read_only = Some(true)),
            Want::Record("readOnly"),
        ),
        (
            "node stage secret",
            Box::new(|p| {
                csi_mut(p).node_stage_secret_ref =
                    Some(SecretReference { name: Some("s".into()), namespace: Some("ns".into()) })
            }),
            Want::Record("nodeStageSecretRef"),
        ),
        (
            "relative recorded path",
            Box::new(|p| {
                attrs_mut(p).insert(ATTR_LOCAL_PATH.into(), "mnt/a".into());
            }),
            Want::Is(TranslateError::BadPath { pv: pv("pv-1"), path: pv("mnt/a"), problem: PathProblem::Relative }),
        ),
    ];
    let t = translator();
    let base = t.translate_to_csi(&local_pv("pv-1", "node-1", "/mnt/disks/a")).unwrap();
    for (what, mutate, want) in cases {
        let mut p = base.clone();
        mutate(&mut p);
        let err = t.translate_to_in_tree(&p).expect_err(what);
        match &want {
            Want::Is(e) => assert_eq!(&err, e, "{what}"),
            Want::Record(mention) => match &err {
                TranslateError::BadRecord { pv, problem } => {
                    assert_eq!(pv, "pv-1", "{what}");
                    assert!(problem.contains(mention), "{what}: {problem:?} should mention {mention}");
                }
                other => panic!("{what}: want BadRecord, got {other:?}"),
            },
        }
        assert_eq!(t.local_origin(&p).expect_err(what), err, "{what}: local_origin agrees");
        let msg = err.to_string();
        if err != TranslateError::Unnamed {
            assert!(msg.contains("pv-1"), "{what}: {msg} should name the PV");
        }
        assert!(msg.contains(';') || msg.contains(':'), "{what}: {msg} should say what to do");
    }
}

// ---- properties ----

const OPERATORS: [&str; 4] = ["In", "NotIn", "Exists", "DoesNotExist"];
const KEYS: [&str; 6] = [
    HOSTNAME_KEY,
    crate::TOPOLOGY_NODE_KEY,
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "example.com/rack",
    "node-role.kubernetes.io/storage",
];

fn label_value() -> impl Strategy<Value = String> {
    "[a-z0-9]([a-z0-9.-]{0,30}[a-z0-9])?"
}

/// Any expression except one naming a node other than `node` with `hostname In`.
fn other_expression(node: String) -> impl Strategy<Value = NodeSelectorRequirement> {
    (prop::sample::select(KEYS.to_vec()), prop::sample::select(OPERATORS.to_vec()), prop::collection::vec(label_value(), 1..3))
        .prop_map(move |(key, operator, values)| {
            let values = match operator {
                "Exists" | "DoesNotExist" => None,
                "In" if key == HOSTNAME_KEY => Some(vec![node.clone()]),
                _ => Some(values),
            };
            NodeSelectorRequirement { key: key.into(), operator: operator.into(), values }
        })
}

fn match_fields(node: String) -> impl Strategy<Value = Option<Vec<NodeSelectorRequirement>>> {
    prop::option::of(Just(vec![NodeSelectorRequirement {
        key: "metadata.name".into(),
        operator: "In".into(),
        values: Some(vec![node]),
    }]))
}

fn extra_term(node: String) -> impl Strategy<Value = NodeSelectorTerm> {
    (prop::collection::vec(other_expression(node.clone()), 0..4), any::<bool>(), match_fields(node)).prop_map(
        |(exprs, none_when_empty, match_fields)| NodeSelectorTerm {
            match_expressions: if exprs.is_empty() && none_when_empty { None } else { Some(exprs) },
            match_fields,
        },
    )
}

fn node_affinity_for(node: String) -> impl Strategy<Value = VolumeNodeAffinity> {
    let exprs = || prop::collection::vec(other_expression(node.clone()), 0..3);
    let terms = || prop::collection::vec(extra_term(node.clone()), 0..3);
    (exprs(), exprs(), match_fields(node.clone()), terms(), terms()).prop_map(
        move |(before, after, fields, terms_before, terms_after)| {
            let mut main = before;
            main.push(NodeSelectorRequirement {
                key: HOSTNAME_KEY.into(),
                operator: "In".into(),
                values: Some(vec![node.clone()]),
            });
            main.extend(after);
            let mut terms = terms_before;
            terms.push(NodeSelectorTerm { match_expressions: Some(main), match_fields: fields });
            terms.extend(terms_after);
            VolumeNodeAffinity { required: Some(NodeSelector { node_selector_terms: terms }) }
        },
    )
}

fn absolute_path() -> impl Strategy<Value = String> {
    (prop::collection::vec("[A-Za-z0-9_:-][A-Za-z0-9_.:-]{0,11}", 1..6), any::<bool>())
        .prop_map(|(parts, trailing)| format!("/{}{}", parts.join("/"), if trailing { "/" } else { "" }))
}

fn string_map() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    prop::option::of(prop::collection::btree_map("([a-z]{1,8}\\.io/)?[a-z][a-z0-9-]{0,10}", "[ -~]{0,20}", 0..4))
}

fn metadata(name: String) -> impl Strategy<Value = ObjectMeta> {
    (
        string_map(),
        string_map(),
        prop::option::of(Just(vec!["kubernetes.io/pv-protection".to_string()])),
        prop::option::of("[0-9]{1,9}"),
        prop::option::of("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"),
    )
        .prop_map(move |(labels, annotations, finalizers, resource_version, uid)| ObjectMeta {
            name: Some(name.clone()),
            labels,
            annotations,
            finalizers,
            resource_version,
            uid,
            ..Default::default()
        })
}

fn claim_ref() -> impl Strategy<Value = Option<ObjectReference>> {
    prop::option::of(("[a-z][a-z0-9-]{0,15}", "[a-z][a-z0-9-]{0,30}", "[0-9a-f]{32}")).prop_map(|c| {
        c.map(|(namespace, name, uid)| ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some(namespace),
            name: Some(name),
            uid: Some(uid),
            ..Default::default()
        })
    })
}

fn local_pvs() -> impl Strategy<Value = PersistentVolume> {
    ("[a-z0-9]([a-z0-9.-]{0,40}[a-z0-9])?", label_value()).prop_flat_map(|(name, node)| {
        let source = (absolute_path(), prop::option::of(prop::sample::select(vec!["ext4", "xfs", "btrfs", ""])));
        let spec_rest = (
            prop::option::of((1u32..4096).prop_map(|n| BTreeMap::from([("storage".to_string(), Quantity(format!("{n}Gi")))]))),
            prop::option::of(prop::sample::subsequence(vec!["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"], 0..=4)),
            prop::option::of("[a-z][a-z0-9-]{0,20}"),
            claim_ref(),
            prop::option::of(prop::sample::select(vec!["Retain", "Delete", "Recycle"])),
            prop::option::of(prop::sample::select(vec!["Filesystem", "Block"])),
            prop::option::of(prop::collection::vec("[a-z][a-z0-9=]{0,11}", 0..3)),
        );
        let status = prop::option::of(prop::sample::select(vec!["Pending", "Available", "Bound", "Released", "Failed"]));
        (metadata(name), source, node_affinity_for(node), spec_rest, status).prop_map(
            |(metadata, (path, fs_type), affinity, (capacity, modes, class, claim_ref, reclaim, mode, mount_options), phase)| {
                PersistentVolume {
                    metadata,
                    spec: Some(PersistentVolumeSpec {
                        access_modes: modes.map(|m| m.into_iter().map(String::from).collect()),
                        capacity,
                        claim_ref,
                        local: Some(LocalVolumeSource { path, fs_type: fs_type.map(String::from) }),
                        mount_options,
                        node_affinity: Some(affinity),
                        persistent_volume_reclaim_policy: reclaim.map(String::from),
                        storage_class_name: class,
                        volume_mode: mode.map(String::from),
                        ..Default::default()
                    }),
                    status: phase.map(|p| PersistentVolumeStatus { phase: Some(p.into()), ..Default::default() }),
                }
            },
        )
    })
}

fn keys(pv: &PersistentVolume) -> Vec<String> {
    terms(pv).iter().flat_map(|t| t.match_expressions.iter().flatten()).map(|e| e.key.clone()).collect()
}

/// The translated PV is a valid drivelet CSI PV that says where it came from.
fn check_csi_output(pv: &PersistentVolume, csi_pv: &PersistentVolume) -> Result<(), TestCaseError> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let local = pv.spec.as_ref().and_then(|s| s.local.clone()).unwrap_or_default();
    let node = node_of(pv).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let spec = csi_pv.spec.as_ref().ok_or_else(|| TestCaseError::fail("no spec"))?;
    prop_assert!(spec.local.is_none());
    let csi = spec.csi.as_ref().ok_or_else(|| TestCaseError::fail("no csi"))?;
    prop_assert_eq!(&csi.driver, DRIVER);
    prop_assert!(!csi.volume_handle.is_empty() && csi.volume_handle.len() <= MAX_HANDLE_BYTES);
    prop_assert!(csi.volume_handle.starts_with(HANDLE_PREFIX));
    prop_assert_eq!(&csi.volume_handle, &volume_handle(&node, &name));
    prop_assert_eq!(&csi.fs_type, &local.fs_type.clone().filter(|f| !f.is_empty()));
    let attrs = csi.volume_attributes.clone().unwrap_or_default();
    prop_assert!(attribute_bytes(&attrs) <= MAX_ATTRIBUTE_BYTES);
    prop_assert_eq!(attrs.get(ATTR_MIGRATED_FROM).map(String::as_str), Some(IN_TREE_PLUGIN));
    prop_assert_eq!(attrs.get(ATTR_NODE), Some(&node));
    prop_assert_eq!(attrs.get(ATTR_LOCAL_PATH), Some(&local.path));
    prop_assert_eq!(attrs.get(ATTR_LOCAL_FSTYPE), local.fs_type.as_ref());
    // Hostname keys are gone, drivelet's key takes their places, nothing else moves.
    let before = keys(pv);
    let after = keys(csi_pv);
    prop_assert_eq!(before.len(), after.len());
    for (b, a) in before.iter().zip(&after) {
        let want = if b == HOSTNAME_KEY { crate::TOPOLOGY_NODE_KEY } else { b.as_str() };
        prop_assert_eq!(a.as_str(), want);
    }
    prop_assert_eq!(&csi_pv.metadata, &pv.metadata);
    prop_assert_eq!(&csi_pv.status, &pv.status);
    prop_assert_eq!(untouched_part(csi_pv), untouched_part(pv));
    // It survives the API's JSON form unchanged.
    let json = serde_json::to_value(csi_pv).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let parsed: PersistentVolume = serde_json::from_value(json).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&parsed, csi_pv);
    Ok(())
}

proptest! {
    #[test]
    fn any_valid_local_pv_round_trips_exactly_through_csi(pv in local_pvs()) {
        let t = translator();
        let csi_pv = t.translate_to_csi(&pv).map_err(|e| TestCaseError::fail(e.to_string()))?;
        check_csi_output(&pv, &csi_pv)?;
        let back = t.translate_to_in_tree(&csi_pv).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(back, pv.clone());
        let origin = t.local_origin(&csi_pv).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let local = pv.spec.as_ref().and_then(|s| s.local.clone()).unwrap_or_default();
        prop_assert_eq!(origin.path, local.path);
        prop_assert_eq!(origin.fs_type, local.fs_type);
        prop_assert_eq!(Ok(origin.node), node_of(&pv));
    }

    #[test]
    fn distinct_node_and_name_pairs_get_distinct_handles(
        a in (label_value(), "[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?"),
        b in (label_value(), "[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?"),
    ) {
        let (ha, hb) = (volume_handle(&a.0, &a.1), volume_handle(&b.0, &b.1));
        prop_assert_eq!(a == b, ha == hb);
        prop_assert_eq!(ha.len(), HANDLE_PREFIX.len() + 36);
    }
}
