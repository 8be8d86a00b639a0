//! The shell around a toy controller (it keeps the names of Nodes, queues each, and logs
//! its runs) against the fake API server serving Nodes and PersistentVolumes from a
//! script. Time is paused.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use kube::ResourceExt;
use serde_json::{json, Value};

use super::*;
use crate::k8s::fake_api::{fake_api_serving, list_of, FakeApi, Script};

/// Ready once the flag says so.
#[derive(Clone)]
struct Flag(tokio::sync::watch::Receiver<bool>);

impl Ready for Flag {
    async fn wait_ready(&self) {
        let mut ready = self.0.clone();
        let _ = ready.wait_for(|r| *r).await;
    }
}

fn settings(resync: Duration) -> Settings {
    Settings { name: "toy controller", workers: 2, resync }
}

/// Keeps Node names; a Node's run logs its name and, when asked, fails once.
struct Toy {
    nodes: BTreeSet<String>,
    runs: Arc<Mutex<Vec<String>>>,
    /// Every list handed over, names in order.
    lists: Arc<Mutex<Vec<Vec<String>>>>,
    /// Keys whose next run fails (once).
    fail: BTreeSet<String>,
}

impl Controller for Toy {
    type First = Node;
    type Second = PersistentVolume;
    type Key = String;
    type Ran = Outcome;
    type Own = ();

    fn scopes(&self) -> (crate::k8s::shell::Scope, crate::k8s::shell::Scope) {
        (crate::k8s::shell::Scope::Cluster, crate::k8s::shell::Scope::Cluster)
    }

    fn keep_first(&self, node: Node) -> Option<Node> {
        (!node.name_any().starts_with("skip")).then_some(node)
    }

    fn keep_second(&self, pv: PersistentVolume) -> Option<PersistentVolume> {
        Some(pv)
    }

    fn second(&mut self, _: Change<PersistentVolume>, _: &mut Pending<'_, String>) {}

    fn first(&mut self, change: Change<Node>, queue: &mut Pending<'_, String>) {
        match change {
            Change::Listed(list) => {
                let names: Vec<String> = list.iter().map(|n| n.name_any()).collect();
                self.lists.lock().expect("lists").push(names.clone());
                for gone in self.nodes.iter().filter(|n| !names.contains(n)) {
                    queue.forget(gone);
                }
                self.nodes = names.into_iter().collect();
            }
            Change::Applied(node) => {
                self.nodes.insert(node.name_any());
                queue.add(node.name_any());
            }
            Change::Deleted(node) => {
                self.nodes.remove(&node.name_any());
                queue.forget(&node.name_any());
            }
        }
    }

    fn queue_all(&self, queue: &mut Pending<'_, String>) {
        for n in &self.nodes {
            queue.add(n.clone());
        }
    }

    fn work(&mut self, key: &String, _failures: u32) -> Work<Outcome> {
        if !self.nodes.contains(key) {
            return Work::Now(Outcome::Done);
        }
        let (runs, key, fail) = (self.runs.clone(), key.clone(), self.fail.remove(key));
        Work::Run(Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            runs.lock().expect("runs").push(key);
            if fail {
                Outcome::Retry(Duration::from_secs(5))
            } else {
                Outcome::Done
            }
        }))
    }

    fn ran(&mut self, _: &String, outcome: Outcome) -> Outcome {
        outcome
    }

    fn own(&self, _: (u64, u64)) {}
}

struct Harness {
    shell: Addr<Shell<Toy>>,
    api: FakeApi,
    runs: Arc<Mutex<Vec<String>>>,
    lists: Arc<Mutex<Vec<Vec<String>>>>,
    ready: tokio::sync::watch::Sender<bool>,
}

impl Harness {
    fn runs(&self) -> Vec<String> {
        std::mem::take(&mut *self.runs.lock().expect("runs"))
    }

    async fn counters(&self) -> Stats<()> {
        self.shell.send(GetStats::default()).await.expect("the shell answers")
    }
}

fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "resourceVersion": "1"}})
}

fn node_obj(name: &str) -> Node {
    serde_json::from_value(node(name)).expect("node")
}

fn nodes(rv: &str, names: &[&str]) -> Value {
    list_of("Node", "v1", rv, names.iter().map(|n| node(n)).collect())
}

/// The watch event of an expired resourceVersion (410 Gone).
fn gone() -> Value {
    json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "too old resource version", "reason": "Expired", "code": 410}})
}

fn start(node_script: Script, ready: bool, resync: Duration, fail: &[&str]) -> Harness {
    let pvs = Script { lists: [list_of("PersistentVolume", "v1", "5", vec![])].into(), ..Default::default() };
    let (client, api) = fake_api_serving(vec![("/api/v1/nodes", node_script), ("/api/v1/persistentvolumes", pvs)]);
    let (tx, rx) = tokio::sync::watch::channel(ready);
    let (runs, lists) = (Arc::default(), Arc::default());
    let toy = Toy {
        nodes: BTreeSet::new(),
        runs: Arc::clone(&runs),
        lists: Arc::clone(&lists),
        fail: fail.iter().map(|s| s.to_string()).collect(),
    };
    let shell = Shell::with(client, settings(resync), Flag(rx), toy).start();
    Harness { shell, api, runs, lists, ready: tx }
}

#[actix_rt::test]
async fn nothing_runs_before_readiness_and_a_key_queued_twice_runs_once() {
    tokio::time::pause();
    let script = Script { lists: [nodes("10", &["a", "b", "skip-me"])].into(), ..Default::default() };
    let mut h = start(script, false, Duration::ZERO, &[]);
    h.api.assert_quiet().await;
    assert_eq!(h.lists.lock().expect("lists").clone(), [["a", "b"]], "what keep_first drops is not handed over");

    // Listed, not ready: the keys wait; a change of a waiting key does not queue it twice.
    h.shell.do_send(WatchItem::<Node, PersistentVolume>::First(Ok(Event::Apply(node_obj("a")))));
    h.shell.do_send(WatchItem::<Node, PersistentVolume>::First(Ok(Event::Apply(node_obj("a")))));
    h.api.assert_quiet().await;
    assert!(h.runs().is_empty(), "nothing runs before the volume side is ready");
    let c = h.counters().await;
    assert_eq!((c.waiting, c.running, c.lists), (2, 0, (1, 1)));

    h.ready.send_replace(true);
    h.api.assert_quiet().await;
    assert_eq!(h.runs(), ["a", "b"], "each key once, as soon as ready");
    assert_eq!(h.counters().await.waiting, 0);
}

#[actix_rt::test]
async fn nothing_runs_before_both_watches_have_listed() {
    tokio::time::pause();
    // The Node list comes, the PersistentVolume list never does.
    let (client, mut api) = fake_api_serving(vec![("/api/v1/nodes", Script { lists: [nodes("10", &["a"])].into(), ..Default::default() })]);
    let (_tx, rx) = tokio::sync::watch::channel(true);
    let runs = Arc::default();
    let toy = Toy {
        nodes: BTreeSet::new(),
        runs: Arc::clone(&runs),
        lists: Arc::default(),
        fail: BTreeSet::new(),
    };
    let shell = Shell::with(client, settings(Duration::ZERO), Flag(rx), toy).start();
    // The PV list request comes to the test, which never answers it.
    let _held = api.next("the PersistentVolume list").await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(runs.lock().expect("runs").is_empty(), "a ready volume side is not enough");
    let c = shell.send(GetStats::<()>::default()).await.expect("answers");
    assert_eq!((c.waiting, c.lists), (1, (1, 0)));
}

#[actix_rt::test]
async fn a_watch_restart_relists_queues_everything_and_forgets_what_went() {
    tokio::time::pause();
    // The first watch dies with 410 Gone; meanwhile a went and c came, which only the
    // second list shows.
    let script = Script { lists: [nodes("10", &["a", "b"]), nodes("30", &["b", "c"])].into(), watches: [vec![gone()]].into() };
    let mut h = start(script, true, Duration::ZERO, &[]);
    h.api.assert_quiet().await;
    assert_eq!(h.lists.lock().expect("lists").clone(), [vec!["a", "b"], vec!["b", "c"]], "listed again after the watch broke");
    assert_eq!(h.runs(), ["a", "b", "b", "c"], "every kept key queued after each list, a not after it went");
    assert_eq!(h.api.count("GET /api/v1/nodes?&limit=500"), 2);
    assert_eq!(h.counters().await.lists, (2, 1));
}

#[actix_rt::test]
async fn resync_queues_everything_again_on_its_interval() {
    tokio::time::pause();
    let script = Script { lists: [nodes("10", &["a", "b"])].into(), ..Default::default() };
    let h = start(script, true, Duration::from_secs(100), &[]);
    tokio::time::sleep(Duration::from_secs(50)).await;
    assert_eq!(h.runs(), ["a", "b"], "the list queues them");
    tokio::time::sleep(Duration::from_secs(40)).await;
    assert!(h.runs().is_empty(), "not before the interval");
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(h.runs(), ["a", "b"], "all again after 100 s");
    tokio::time::sleep(Duration::from_secs(100)).await;
    assert_eq!(h.runs(), ["a", "b"], "and every 100 s");
}

#[actix_rt::test]
async fn a_failed_run_comes_back_after_its_delay_and_counts_as_a_retry() {
    tokio::time::pause();
    let script = Script { lists: [nodes("10", &["a"])].into(), ..Default::default() };
    let h = start(script, true, Duration::ZERO, &["a"]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(h.runs(), ["a"]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(h.runs().is_empty(), "not before its 5 s delay");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(h.runs(), ["a"], "again after it");
    let c = h.counters().await;
    assert_eq!((c.retries, c.waiting, c.running), (1, 0, 0));
}
