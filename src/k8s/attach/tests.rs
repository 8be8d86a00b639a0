use serde_json::json;

use super::executor::finalizer_patch;
use super::fixtures::*;
use super::*;
use k8s_openapi::api::storage::v1::VolumeError;

const S: fn(u64) -> Duration = Duration::from_secs;

fn policy() -> RetryPolicy {
    RetryPolicy { base: S(1), cap: S(60), terminal: S(600) }
}

fn publish_ok() -> Vec<Action> {
    vec![publish("vol-1"), Action::MarkAttached]
}

fn attach_error(message: &str, after: Duration) -> Vec<Action> {
    vec![
        Action::PatchStatus {
            attached: Some(false),
            attach_error: ErrorPatch::Set(message.into()),
            detach_error: ErrorPatch::Keep,
        },
        Action::RecordEvent {
            kind: EventKind::Warning,
            reason: "AttachFailed".into(),
            action: "Attach".into(),
            message: message.into(),
        },
        Action::Requeue { after },
    ]
}

fn cat(parts: Vec<Vec<Action>>) -> Vec<Action> {
    parts.into_iter().flatten().collect()
}

#[test]
fn reconcile_table_follows_the_external_attacher_rules() {
    let mut other_attacher = va("va", "pv-1");
    other_attacher.spec.attacher = "ebs.csi.aws.com".into();
    let mut other_node = va("va", "pv-1");
    other_node.spec.node_name = "node-b".into();
    let mut deleting_pv = pv_with_finalizer(pv("pv-1", "vol-1"));
    deleting_pv.metadata.deletion_timestamp = deleted();
    let mut deleting_va = with_finalizer(attached(va("va", "pv-1")));
    deleting_va.metadata.deletion_timestamp = deleted();
    let mut deleting_va_without_finalizer = va("va", "pv-1");
    deleting_va_without_finalizer.metadata.deletion_timestamp = deleted();
    let mut failed_before = with_finalizer(va("va", "pv-1"));
    failed_before.status = Some(k8s_openapi::api::storage::v1::VolumeAttachmentStatus {
        attached: false,
        attach_error: Some(VolumeError { message: Some("earlier".into()), ..Default::default() }),
        ..Default::default()
    });
    let mut no_csi_pv = pv("pv-1", "vol-1");
    no_csi_pv.spec.as_mut().expect("spec").csi = None;
    let mut no_source = va("va", "pv-1");
    no_source.spec.source.persistent_volume_name = None;

    let fin_va = with_finalizer(va("va", "pv-1"));
    let no_source_va = with_finalizer(no_source);
    let no_csi_fin_pv = pv_with_finalizer(no_csi_pv);
    let plain_pv = pv("pv-1", "vol-1");
    let fin_pv = pv_with_finalizer(pv("pv-1", "vol-1"));
    let plain_va = va("va", "pv-1");
    let done_va = with_finalizer(attached(va("va", "pv-1")));
    let unusable = VolumeState::Unusable { reason: "drive SN123 is failing (SMART)".into() };

    // (case, va, pv, other attachments, volume, failures, expected)
    let table: Vec<(&str, &VolumeAttachment, Option<&PersistentVolume>, usize, VolumeState, u32, Vec<Action>)> = vec![
        ("another driver's attachment is ignored", &other_attacher, Some(&plain_pv), 0, usable(), 0, vec![]),
        ("another node's attachment is ignored", &other_node, Some(&plain_pv), 0, usable(), 0, vec![]),
        (
            "a new attachment gets both finalizers, is published and marked attached",
            &plain_va,
            Some(&plain_pv),
            0,
            usable(),
            0,
            cat(vec![vec![Action::AddFinalizer, Action::AddPvFinalizer], publish_ok()]),
        ),
        (
            "finalizers already present are not added again",
            &fin_va,
            Some(&fin_pv),
            0,
            usable(),
            0,
            publish_ok(),
        ),
        ("an attachment whose PV is being deleted is skipped", &plain_va, Some(&deleting_pv), 0, usable(), 0, vec![]),
        (
            "a named PV not seen yet is waited for with backoff",
            &plain_va,
            None,
            0,
            usable(),
            2,
            vec![Action::Requeue { after: S(4) }],
        ),
        ("an attached attachment is left alone", &done_va, Some(&fin_pv), 0, usable(), 0, vec![]),
        (
            "an attached attachment still gets a missing PV finalizer",
            &done_va,
            Some(&plain_pv),
            0,
            unusable.clone(),
            0,
            vec![Action::AddPvFinalizer],
        ),
        (
            "an attach error from before is retried and cleared on success",
            &failed_before,
            Some(&fin_pv),
            0,
            usable(),
            3,
            publish_ok(),
        ),
        (
            "a volume the manager does not know is an attach error retried with backoff",
            &plain_va,
            Some(&plain_pv),
            0,
            VolumeState::Missing,
            3,
            cat(vec![
                vec![Action::AddFinalizer, Action::AddPvFinalizer],
                attach_error("volume vol-1 does not exist on node node-a", S(8)),
            ]),
        ),
        (
            "a failing drive is a terminal attach error with the long requeue",
            &fin_va,
            Some(&fin_pv),
            0,
            unusable.clone(),
            0,
            attach_error("volume vol-1 cannot be attached: drive SN123 is failing (SMART)", S(600)),
        ),
        (
            "a PV without a CSI source is a terminal attach error",
            &fin_va,
            Some(&no_csi_fin_pv),
            0,
            usable(),
            0,
            attach_error("PersistentVolume pv-1 has no CSI source", S(600)),
        ),
        (
            "an attachment naming no volume at all is a terminal attach error",
            &no_source_va,
            None,
            0,
            usable(),
            0,
            attach_error("VolumeAttachment names neither a PersistentVolume nor a CSI inline volume", S(600)),
        ),
        (
            "a deleted attachment is unpublished and loses its finalizer",
            &deleting_va,
            Some(&fin_pv),
            0,
            usable(),
            0,
            vec![Action::Unpublish { volume_id: "vol-1".into() }, Action::RemoveFinalizer],
        ),
        (
            "a deleted attachment of a volume the manager does not know just loses its finalizer",
            &deleting_va,
            Some(&fin_pv),
            0,
            VolumeState::Missing,
            0,
            vec![Action::RemoveFinalizer],
        ),
        (
            "a deleted attachment on a failing drive is still unpublished",
            &deleting_va,
            Some(&fin_pv),
            0,
            unusable.clone(),
            0,
            vec![Action::Unpublish { volume_id: "vol-1".into() }, Action::RemoveFinalizer],
        ),
        (
            "a deleted attachment whose PV is gone loses its finalizer without unpublish",
            &deleting_va,
            None,
            0,
            usable(),
            0,
            vec![Action::RemoveFinalizer],
        ),
        (
            "a deleted attachment of a deleted PV releases the PV when nothing else uses it",
            &deleting_va,
            Some(&deleting_pv),
            0,
            usable(),
            0,
            vec![Action::Unpublish { volume_id: "vol-1".into() }, Action::RemoveFinalizer, Action::RemovePvFinalizer],
        ),
        (
            "a deleted attachment keeps the PV finalizer while another attachment uses the PV",
            &deleting_va,
            Some(&deleting_pv),
            1,
            usable(),
            0,
            vec![Action::Unpublish { volume_id: "vol-1".into() }, Action::RemoveFinalizer],
        ),
        (
            "a deleted attachment without our finalizer only releases a deleted PV",
            &deleting_va_without_finalizer,
            Some(&deleting_pv),
            0,
            usable(),
            0,
            vec![Action::RemovePvFinalizer],
        ),
        (
            "a deleted attachment without our finalizer leaves a live PV alone",
            &deleting_va_without_finalizer,
            Some(&fin_pv),
            0,
            usable(),
            0,
            vec![],
        ),
    ];
    for (case, va, pv, others, volume, failures, want) in table {
        let obs = Observed { va, pv, other_attachments: others, volume: &volume, failures };
        assert_eq!(reconcile(&obs, &identity(), &policy()), want, "{case}");
    }
}

#[test]
fn the_volume_managers_answer_decides_missing_unusable_or_retry_by_variant() {
    use crate::words::DriveUseState;
    type E = crate::actors::volumes::VolumeError;
    let v = || "v1".to_string();
    let d = || "d1".to_string();
    // (answer, what the attacher makes of it: the volume state, or None for a retry with backoff)
    let table: Vec<(Result<(), E>, Option<VolumeState>)> = vec![
        (Ok(()), Some(VolumeState::Usable)),
        (Err(E::NotFound { volume_id: v() }), Some(VolumeState::Missing)),
        (
            Err(E::DriveFailing { volume_id: v(), drive_id: d(), health: "12 reallocated sectors".into() }),
            Some(VolumeState::Unusable {
                reason: "lives on drive d1 which is failing (12 reallocated sectors); it takes no new attachments: move the data to another volume".into(),
            }),
        ),
        (
            Err(E::DriveReleasing { volume_id: v(), drive_id: d(), state: DriveUseState::Released, reason: "asked".into() }),
            Some(VolumeState::Unusable {
                reason: "lives on drive d1 which is released (asked); it takes no new attachments: move the data to another volume".into(),
            }),
        ),
        (
            Err(E::DriveMissing { volume_id: v(), drive_id: d() }),
            Some(VolumeState::Unusable { reason: "lives on drive d1 which is missing from this node; put the drive back".into() }),
        ),
        (
            Err(E::AttachedElsewhere { volume_id: v(), node: "n2".into() }),
            Some(VolumeState::Unusable { reason: "is already attached to node n2; a local volume serves one node".into() }),
        ),
        (
            Err(E::WrongAccessType { volume_id: v(), block: false, call: "published" }),
            Some(VolumeState::Unusable { reason: "was created for filesystem access; it cannot be published for block access".into() }),
        ),
        (Err(E::Busy { volume_id: v() }), None),
        (Err(E::NotReady), None),
    ];
    for (answer, want) in table {
        let shown = format!("{answer:?}");
        match (volume_state(answer), want) {
            (Ok(got), Some(want)) => assert_eq!(got, want, "{shown}"),
            (Err(e), None) => assert_eq!(e.kind(), RefusalKind::Transient, "{shown}"),
            (got, want) => panic!("{shown}: got {got:?}, want {want:?}"),
        }
    }
    let gone = VolumeCallError::Unavailable("the volume manager did not answer: Mailbox has closed".into());
    assert_eq!(gone.kind(), RefusalKind::Transient);
    assert_eq!(gone.to_string(), "the volume manager did not answer: Mailbox has closed");
}

#[test]
fn publish_spec_takes_the_access_type_from_the_pv_or_the_inline_spec() {
    let va1 = va("va", "pv-1");
    assert_eq!(publish_spec(&va1, None), None, "a named PV not at hand gives nothing");
    let mut block = pv("pv-1", "vol-1");
    let spec = block.spec.as_mut().expect("spec");
    spec.volume_mode = Some("Block".into());
    assert_eq!(
        publish_spec(&va1, Some(&block)),
        Some(PublishSpec { volume_id: "vol-1".into(), block: true, fs_type: String::new() })
    );
    let mut xfs = pv("pv-1", "vol-1");
    let spec = xfs.spec.as_mut().expect("spec");
    spec.volume_mode = Some("Filesystem".into());
    spec.csi.as_mut().expect("csi").fs_type = Some("xfs".into());
    assert_eq!(
        publish_spec(&va1, Some(&xfs)),
        Some(PublishSpec { volume_id: "vol-1".into(), block: false, fs_type: "xfs".into() })
    );
    let mut inline = va("va", "pv-1");
    inline.spec.source.persistent_volume_name = None;
    inline.spec.source.inline_volume_spec = pv("x", "vol-9").spec;
    assert_eq!(
        publish_spec(&inline, None),
        Some(PublishSpec { volume_id: "vol-9".into(), block: false, fs_type: String::new() })
    );
}

#[test]
fn pv_finalizer_is_removed_only_from_a_deleted_pv_no_attachment_names() {
    let mut deleting = pv_with_finalizer(pv("pv-1", "vol-1"));
    deleting.metadata.deletion_timestamp = deleted();
    let mut deleting_without_ours = pv("pv-1", "vol-1");
    deleting_without_ours.metadata.deletion_timestamp = deleted();
    let table = [
        ("deleted and unused", &deleting, 0, vec![Action::RemovePvFinalizer]),
        ("deleted but still attached somewhere", &deleting, 1, vec![]),
        ("live and unused", &pv_with_finalizer(pv("pv-1", "vol-1")), 0, vec![]),
        ("deleted without our finalizer", &deleting_without_ours, 0, vec![]),
    ];
    for (case, pv, attachments, want) in table {
        assert_eq!(reconcile_pv(pv, &identity(), attachments), want, "{case}");
    }
}

#[test]
fn failed_detach_keeps_attached_and_backs_off() {
    assert_eq!(
        detach_failed("volume vol-1 busy".into(), 2, &policy()),
        vec![
            Action::PatchStatus {
                attached: None,
                attach_error: ErrorPatch::Keep,
                detach_error: ErrorPatch::Set("volume vol-1 busy".into()),
            },
            Action::RecordEvent {
                kind: EventKind::Warning,
                reason: "DetachFailed".into(),
                action: "Detach".into(),
                message: "volume vol-1 busy".into(),
            },
            Action::Requeue { after: S(4) },
        ]
    );
}

#[test]
fn finalizer_patch_keeps_other_finalizers_and_guards_the_resource_version() {
    let mut obj = va("va", "pv-1");
    obj.metadata.finalizers = Some(vec!["kubernetes.io/other".into()]);
    assert_eq!(
        finalizer_patch(&obj, FINALIZER, true),
        json!({"metadata": {"finalizers": ["kubernetes.io/other", FINALIZER], "resourceVersion": "1"}})
    );
    obj.metadata.finalizers = Some(vec![FINALIZER.into(), "kubernetes.io/other".into()]);
    assert_eq!(
        finalizer_patch(&obj, FINALIZER, false),
        json!({"metadata": {"finalizers": ["kubernetes.io/other"], "resourceVersion": "1"}})
    );
}
