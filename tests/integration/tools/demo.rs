//! The demo's loop drives: made at start, detached and (with
//! `demo.remove_files_on_stop`) removed at stop together with the volume store, so the
//! next start's store matches its blank drives and lists no phantom volume.

use crate::common::*;

const MIB: u64 = 1 << 20;

#[test]
fn a_demo_restart_starts_from_blank_drives_and_an_empty_store() {
    require_host();
    let tmp = short_tempdir();
    // The demo's files, `<dir>/drive-N.img`, are what the harness's filter admits.
    let opts = AgentOpts {
        extra_toml: format!(
            "[demo]\nenabled = true\ndir = \"{}\"\ndrives = 2\nsize = \"256Mi\"\nremove_files_on_stop = true\n",
            tmp.path().display()
        ),
        ..Default::default()
    };
    let mut agent = Agent::start(tmp.path(), opts);
    let managed = |agent: &Agent| {
        agent.ctl_drives().as_array().unwrap().iter().filter(|d| d["class"] == "managed").count()
    };
    assert_eq!(managed(&agent), 2, "the demo's two drives: {}", agent.ctl_drives());
    let id = rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        c.ctrl.create_volume(create_req("pvc-demo", 64 * MIB, block_cap())).await.unwrap().into_inner().volume.unwrap().volume_id
    });
    assert_eq!(agent.ctl_volumes().as_array().unwrap().len(), 1);
    assert_eq!(agent.stop(), 0);
    for i in 0..2 {
        assert!(!tmp.path().join(format!("drive-{i}.img")).exists(), "the demo's files are removed at stop");
    }

    agent.spawn();
    assert_eq!(managed(&agent), 2, "blank drives again");
    let vols = agent.ctl_volumes();
    assert!(vols.as_array().unwrap().is_empty(), "no phantom of {id}: {vols}");
    assert_eq!(agent.stop(), 0);
}
