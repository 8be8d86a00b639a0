//! drivelet as a Kubernetes citizen, end to end: the real binary on real loop drives,
//! talking over HTTP to a small in-process API server that keeps objects, resource
//! versions, merge and apply patches, finalizers and deletion, and serves list and
//! watch the way the real one does. The test plays the cluster: it creates PVs, pods
//! and VolumeAttachments and reads back what drivelet wrote.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use crate::common::*;
use drivelet::grpc::proto::csi;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;

const DRIVER: &str = "csi.drivelet.io";
const FINALIZER: &str = "external-attacher/csi.drivelet.io";
const VAS: &str = "/apis/storage.k8s.io/v1/volumeattachments";
const PVS: &str = "/api/v1/persistentvolumes";
const NODES: &str = "/api/v1/nodes";
const PODS: &str = "/api/v1/namespaces/apps/pods";
const DRIVES: &str = "/apis/drivelet.io/v1alpha1/drives";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/drivelet-system/leases";
const CONFIGMAPS: &str = "/api/v1/namespaces/drivelet-system/configmaps";
const PLURALS: [&str; 12] = [
    "volumeattachments",
    "persistentvolumes",
    "persistentvolumeclaims",
    "drives",
    "nodes",
    "pods",
    "events",
    "leases",
    "configmaps",
    "namespaces",
    "storageclasses",
    "csistoragecapacities",
];

type Body = BoxBody<Bytes, Infallible>;

/// One change, as a watch sends it.
struct Change {
    collection: String,
    rv: u64,
    kind: &'static str,
    object: Value,
    /// The object before the change, when there was one.
    old: Option<Value>,
}

/// Whether a list or watch of `asked` holds the objects of `collection`: the same path,
/// or, as the real API server answers `/api/v1/pods`, the all-namespaces path of a
/// namespaced collection (`/api/v1/namespaces/apps/pods`).
fn covers(asked: &str, collection: &str) -> bool {
    if asked == collection {
        return true;
    }
    let Some((prefix, plural)) = asked.rsplit_once('/') else { return false };
    collection
        .strip_prefix(&format!("{prefix}/namespaces/"))
        .and_then(|rest| rest.strip_suffix(&format!("/{plural}")))
        .is_some_and(|ns| !ns.is_empty() && !ns.contains('/'))
}

/// What a watch with selectors `params` sees of a change, as the real API server sends
/// it: an object that starts matching is ADDED, one that stops is DELETED, one that
/// matches neither before nor after is not sent.
fn seen_as(kind: &'static str, old: Option<&Value>, new: &Value, params: &BTreeMap<String, String>) -> Option<&'static str> {
    let before = old.is_some_and(|o| matches_selectors(o, params));
    let after = matches_selectors(new, params);
    match (kind, before, after) {
        ("DELETED", b, a) => (b || a).then_some("DELETED"),
        (_, true, true) => Some(kind),
        (_, false, true) => Some("ADDED"),
        (_, true, false) => Some("DELETED"),
        (_, false, false) => None,
    }
}

#[derive(Default)]
struct State {
    rv: u64,
    /// Objects by collection path, then name.
    objects: BTreeMap<String, BTreeMap<String, Value>>,
    history: Vec<Change>,
    /// Each watch: its collection, its selectors, where its events go.
    watchers: Vec<(String, BTreeMap<String, String>, mpsc::UnboundedSender<Bytes>)>,
    /// Every request: "METHOD path?query".
    log: Vec<String>,
}

impl State {
    fn record(&mut self, collection: &str, kind: &'static str, object: Value, old: Option<Value>) {
        self.watchers.retain(|(c, params, tx)| {
            if !covers(c, collection) {
                return true;
            }
            match seen_as(kind, old.as_ref(), &object, params) {
                Some(k) => tx.send(Bytes::from(format!("{}\n", json!({"type": k, "object": object})))).is_ok(),
                None => !tx.is_closed(),
            }
        });
        self.history.push(Change { collection: collection.to_string(), rv: self.rv, kind, object, old });
    }

    fn bump(&mut self, obj: &mut Value) {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
    }

    /// Stores `obj` as a change of `kind`, or deletes it when it is being deleted and no
    /// finalizer holds it.
    fn store(&mut self, collection: &str, name: &str, mut obj: Value, kind: &'static str) -> Value {
        self.bump(&mut obj);
        let old = self.objects.get(collection).and_then(|c| c.get(name)).cloned();
        let finalizers = obj["metadata"]["finalizers"].as_array().is_some_and(|f| !f.is_empty());
        if obj["metadata"]["deletionTimestamp"].is_string() && !finalizers {
            if let Some(c) = self.objects.get_mut(collection) {
                c.remove(name);
            }
            self.record(collection, "DELETED", obj.clone(), old);
        } else {
            self.objects.entry(collection.to_string()).or_default().insert(name.to_string(), obj.clone());
            self.record(collection, kind, obj.clone(), old);
        }
        obj
    }
}

/// The in-process API server.
#[derive(Clone)]
struct FakeApi {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn full(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .expect("response")
}

fn status_error(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    full(code, &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "message": message, "code": code.as_u16()}))
}

fn matches_selectors(obj: &Value, params: &BTreeMap<String, String>) -> bool {
    let label_ok = params.get("labelSelector").is_none_or(|sel| {
        sel.split(',').filter(|s| !s.is_empty()).all(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            obj["metadata"]["labels"][k].as_str() == Some(v)
        })
    });
    let field_ok = params.get("fieldSelector").is_none_or(|sel| {
        sel.split(',').filter(|s| !s.is_empty()).all(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let mut at = obj;
            for part in k.split('.') {
                at = &at[part];
            }
            at.as_str() == Some(v)
        })
    });
    label_ok && field_ok
}

impl FakeApi {
    fn start() -> FakeApi {
        let (tx, rx) = std::sync::mpsc::channel();
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
                tx.send(listener.local_addr().expect("addr")).expect("send addr");
                loop {
                    let Ok((stream, _)) = listener.accept().await else { continue };
                    let state = shared.clone();
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |req| handle(state.clone(), req));
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                            .await;
                    });
                }
            });
        });
        let addr = rx.recv_timeout(Duration::from_secs(10)).expect("API server listening");
        let api = FakeApi { addr, state };
        // Every cluster has it; its uid is the cluster id drivelet writes on its drives.
        api.create("/api/v1/namespaces", json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}}));
        api
    }

    /// A kubeconfig pointing at this server.
    fn kubeconfig(&self, dir: &Path) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\nusers:\n- name: drivelet\n  user:\n    token: test\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: drivelet\ncurrent-context: fake\n",
            self.addr
        );
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    fn create(&self, collection: &str, mut obj: Value) {
        let mut st = self.state.lock().expect("state");
        let name = obj["metadata"]["name"].as_str().expect("name").to_string();
        obj["metadata"]["uid"] = json!(format!("uid-{name}"));
        obj["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        st.store(collection, &name, obj, "ADDED");
    }

    /// DELETE as kubectl does it: finalizers hold the object with a deletionTimestamp.
    fn delete(&self, collection: &str, name: &str) {
        let mut st = self.state.lock().expect("state");
        let obj = st.objects.get(collection).and_then(|c| c.get(name)).cloned().expect("object to delete");
        let mut obj = obj;
        obj["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:10Z");
        st.store(collection, name, obj, "MODIFIED");
    }

    fn get(&self, collection: &str, name: &str) -> Option<Value> {
        self.state.lock().expect("state").objects.get(collection).and_then(|c| c.get(name)).cloned()
    }

    fn list(&self, collection_suffix: &str) -> Vec<Value> {
        let st = self.state.lock().expect("state");
        st.objects.iter().filter(|(c, _)| c.ends_with(collection_suffix)).flat_map(|(_, objs)| objs.values().cloned()).collect()
    }

    fn log(&self) -> Vec<String> {
        self.state.lock().expect("state").log.clone()
    }

    /// Waits up to `within` for `f` to give something.
    fn wait_for<T>(&self, within: Duration, what: &str, agent: &Agent, mut f: impl FnMut(&FakeApi) -> Option<T>) -> T {
        let deadline = Instant::now() + within;
        loop {
            if let Some(t) = f(self) {
                return t;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {within:?}\nrequests:\n{}\nagent log tail:\n{}",
                self.log().join("\n"),
                agent.log_tail(40)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

async fn handle(state: Arc<Mutex<State>>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let ctype = req.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let params: BTreeMap<String, String> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect();
    let mut st = state.lock().expect("state");
    st.log.push(if query.is_empty() { format!("{method} {path}") } else { format!("{method} {path}?{query}") });

    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let n = segs.len();
    let join = |k: usize| format!("/{}", segs[..k].join("/"));
    // A status subresource patch is merged into the object like any other patch.
    let (collection, name) = if PLURALS.contains(&segs[n - 1]) {
        (path.clone(), None)
    } else if n >= 2 && PLURALS.contains(&segs[n - 2]) {
        (join(n - 1), Some(segs[n - 1].to_string()))
    } else if n >= 3 && segs[n - 1] == "status" && PLURALS.contains(&segs[n - 3]) {
        (join(n - 2), Some(segs[n - 2].to_string()))
    } else {
        return Ok(status_error(StatusCode::NOT_FOUND, "NotFound", &format!("no route {path}")));
    };
    let body_json: Value = if body.is_empty() { Value::Null } else { serde_json::from_slice(&body).unwrap_or(Value::Null) };

    let response = match (method.as_str(), name) {
        ("GET", None) if params.get("watch").map(String::as_str) == Some("true") => {
            let since: u64 = params.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
            let (tx, rx) = mpsc::unbounded_channel();
            for c in st.history.iter().filter(|c| covers(&collection, &c.collection) && c.rv > since) {
                if let Some(k) = seen_as(c.kind, c.old.as_ref(), &c.object, &params) {
                    let _ = tx.send(Bytes::from(format!("{}\n", json!({"type": k, "object": c.object}))));
                }
            }
            st.watchers.push((collection.clone(), params.clone(), tx));
            let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(rx).map(|b| Ok::<_, Infallible>(Frame::data(b)));
            Response::builder()
                .header("content-type", "application/json")
                .body(BodyExt::boxed(StreamBody::new(stream)))
                .expect("watch response")
        }
        ("GET", None) => {
            let items: Vec<Value> = st
                .objects
                .iter()
                .filter(|(c, _)| covers(&collection, c))
                .flat_map(|(_, objs)| objs.values().filter(|o| matches_selectors(o, &params)).cloned())
                .collect();
            full(StatusCode::OK, &json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": st.rv.to_string()}, "items": items}))
        }
        ("GET", Some(name)) => match st.objects.get(&collection).and_then(|c| c.get(&name)) {
            Some(o) => full(StatusCode::OK, o),
            None => status_error(StatusCode::NOT_FOUND, "NotFound", &format!("{name} not found")),
        },
        ("POST", None) => {
            let mut obj = body_json;
            let name = match obj["metadata"]["name"].as_str() {
                Some(n) => n.to_string(),
                None => format!("{}{}", obj["metadata"]["generateName"].as_str().unwrap_or("obj-"), st.rv + 1),
            };
            obj["metadata"]["name"] = json!(name);
            let stored = st.store(&collection, &name, obj, "ADDED");
            full(StatusCode::CREATED, &stored)
        }
        ("PATCH", Some(name)) => {
            let current = st.objects.get(&collection).and_then(|c| c.get(&name)).cloned();
            let apply = ctype.starts_with("application/apply-patch");
            let mut patch = body_json;
            let wanted_rv = patch["metadata"]["resourceVersion"].as_str().map(str::to_owned);
            if let Some(meta) = patch.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("resourceVersion");
            }
            match current {
                None if apply => {
                    let stored = st.store(&collection, &name, patch, "ADDED");
                    full(StatusCode::CREATED, &stored)
                }
                None => status_error(StatusCode::NOT_FOUND, "NotFound", &format!("{name} not found")),
                Some(cur) if wanted_rv.as_ref().is_some_and(|rv| Some(rv.as_str()) != cur["metadata"]["resourceVersion"].as_str()) => {
                    status_error(StatusCode::CONFLICT, "Conflict", "the object has been modified")
                }
                Some(mut cur) => {
                    merge(&mut cur, &patch);
                    let stored = st.store(&collection, &name, cur, "MODIFIED");
                    full(StatusCode::OK, &stored)
                }
            }
        }
        ("PUT", Some(name)) => {
            let current = st.objects.get(&collection).and_then(|c| c.get(&name)).cloned();
            let wanted_rv = body_json["metadata"]["resourceVersion"].as_str().map(str::to_owned);
            match current {
                None => status_error(StatusCode::NOT_FOUND, "NotFound", &format!("{name} not found")),
                Some(cur) if wanted_rv.as_ref().is_some_and(|rv| Some(rv.as_str()) != cur["metadata"]["resourceVersion"].as_str()) => {
                    status_error(StatusCode::CONFLICT, "Conflict", "the object has been modified")
                }
                Some(_) => {
                    let stored = st.store(&collection, &name, body_json, "MODIFIED");
                    full(StatusCode::OK, &stored)
                }
            }
        }
        ("DELETE", Some(name)) => match st.objects.get(&collection).and_then(|c| c.get(&name)).cloned() {
            Some(mut obj) => {
                obj["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:10Z");
                let stored = st.store(&collection, &name, obj, "MODIFIED");
                full(StatusCode::OK, &stored)
            }
            None => status_error(StatusCode::NOT_FOUND, "NotFound", &format!("{name} not found")),
        },
        _ => status_error(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "not served"),
    };
    Ok(response)
}

/// The RBAC (verb, group, resource) a logged request is authorized as.
fn authorized_as(line: &str) -> (String, String, String) {
    let (method, uri) = line.split_once(' ').expect("METHOD uri");
    let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segs[0] {
        "api" => (String::new(), &segs[2..]),
        _ => (segs[1].to_string(), &segs[3..]),
    };
    let rest: Vec<&str> = if rest.first() == Some(&"namespaces") && rest.len() > 2 { rest[2..].to_vec() } else { rest.to_vec() };
    let resource = if rest.len() == 3 { format!("{}/{}", rest[0], rest[2]) } else { rest[0].to_string() };
    let verb = match (method, rest.len()) {
        ("GET", 1) if query.contains("watch=true") => "watch",
        ("GET", 1) => "list",
        ("GET", _) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        (m, _) => panic!("unexpected method {m}"),
    };
    (verb.to_string(), group, resource)
}

/// Every request drivelet made is allowed by `k8s::rbac::PERMISSIONS` (which the
/// deployment's ClusterRole must equal).
fn assert_requests_are_permitted(api: &FakeApi) {
    use drivelet::k8s::rbac::PERMISSIONS;
    for line in api.log() {
        let (verb, group, resource) = authorized_as(&line);
        let allowed = PERMISSIONS.iter().any(|p| p.group == group && p.resource == resource && p.verbs.contains(&verb.as_str()));
        assert!(allowed, "{line} needs {verb} on {group}/{resource}, which k8s::rbac::PERMISSIONS (and the deployment's RBAC) lacks");
    }
}

fn pv(name: &str, volume_id: &str, claim: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "64Mi"},
            "accessModes": ["ReadWriteOnce"],
            "volumeMode": "Filesystem",
            "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "apps", "name": claim, "uid": "uid-claim"},
            "csi": {"driver": DRIVER, "volumeHandle": volume_id, "fsType": "ext4"}
        },
        "status": {"phase": "Bound"}
    })
}

fn va(name: &str, pv: &str) -> Value {
    json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": name},
        "spec": {"attacher": DRIVER, "nodeName": NODE, "source": {"persistentVolumeName": pv}}
    })
}

fn pod(name: &str, claim: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "apps"},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "app", "image": "busybox"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
        },
        "status": {"phase": "Running"}
    })
}

fn kube_opts(api: &FakeApi, dir: &Path) -> AgentOpts {
    AgentOpts {
        extra_toml: format!(
            r#"
[health]
interval = "1s"
volume_check_interval = "200ms"
[kubernetes]
enabled = true
kubeconfig = "{}"
attach_backoff_base = "100ms"
attach_backoff_cap = "1s"
attach_terminal_retry = "2s"
event_interval = "1s"
drive_resync_interval = "10s"
label_node = true
"#,
            api.kubeconfig(dir).display()
        ),
        ..AgentOpts::default()
    }
}

fn has_finalizer(obj: &Value) -> bool {
    obj["metadata"]["finalizers"].as_array().is_some_and(|f| f.iter().any(|x| x == FINALIZER))
}

fn events_about<'a>(events: &'a [Value], kind: &str, name: &str, reason: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["regarding"]["kind"] == kind && e["regarding"]["name"] == name && e["reason"] == reason)
        .collect()
}

#[test]
fn volume_attachments_are_attached_detached_and_refused_through_the_api() {
    require_host();
    let tmp = short_tempdir();
    let dir = tmp.path();
    let mut drive = LoopDrive::new(dir, "k1.img", 1 << 30);
    let api = FakeApi::start();
    api.create(NODES, json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}}));
    let agent = Agent::start(dir, kube_opts(&api, dir));
    let rt = rt();

    // The node gets its topology labels (label_node = true).
    api.wait_for(Duration::from_secs(10), "node labels", &agent, |api| {
        let node = api.get(NODES, NODE)?;
        let labels = &node["metadata"]["labels"];
        (labels["topology.drivelet.io/node"] == NODE && labels["topology.kubernetes.io/zone"] == "zone-a").then_some(())
    });

    // A volume, its PV bound to a claim, a pod using the claim, and the attachment.
    let id = rt.block_on(async {
        let mut csi = Csi::connect(&agent).await;
        let r = csi.ctrl.create_volume(create_req("pvc-k1", 64 << 20, mount_cap("ext4"))).await.expect("create");
        r.into_inner().volume.expect("volume").volume_id
    });
    api.create(PVS, pv("pv-1", &id, "claim-1"));
    api.create(PODS, pod("pod-1", "claim-1"));
    api.create(VAS, va("va-1", "pv-1"));

    let attached = api.wait_for(Duration::from_secs(10), "va-1 attached", &agent, |api| {
        api.get(VAS, "va-1").filter(|v| v["status"]["attached"] == true)
    });
    assert!(has_finalizer(&attached), "our finalizer on the VolumeAttachment: {attached}");
    assert!(has_finalizer(&api.get(PVS, "pv-1").expect("pv")), "our finalizer on the PV");
    let device = attached["status"]["attachmentMetadata"]["drivelet.io/device"].as_str().expect("device in attachmentMetadata");
    assert!(Path::new(device).exists(), "attachmentMetadata names a real device node: {device}");
    assert_eq!(attached["status"]["attachmentMetadata"]["drivelet.io/partition-guid"], json!(id));
    let published = |rt: &tokio::runtime::Runtime| {
        rt.block_on(async {
            let mut csi = Csi::connect(&agent).await;
            let r = csi.ctrl.controller_get_volume(csi::ControllerGetVolumeRequest { volume_id: id.clone() }).await.expect("get volume");
            r.into_inner().status.expect("status").published_node_ids
        })
    };
    assert_eq!(published(&rt), [NODE], "the volume manager holds the attachment");

    // The drive has its Drive object, owned by this node, listing the volume.
    let drive_object = |api: &FakeApi| {
        api.list(DRIVES).into_iter().find(|d| d["status"]["volumes"].as_array().is_some_and(|v| v.contains(&json!(id))))
    };
    let object = api.wait_for(Duration::from_secs(10), "the drive's Drive object", &agent, drive_object);
    assert_eq!(object["spec"]["node"], NODE);
    assert_eq!(object["metadata"]["labels"]["drivelet.io/node"], NODE);
    assert_eq!(object["status"]["class"], "managed");
    assert_eq!(object["spec"]["sizeBytes"], 1u64 << 30);
    assert_eq!(object["spec"]["size"], "1.0 GiB", "the SIZE column in binary units");
    assert_eq!(object["status"]["presence"], "present", "the PRESENCE column");

    // kubectl delete: our finalizer holds the object until the volume is detached.
    api.delete(VAS, "va-1");
    api.wait_for(Duration::from_secs(10), "va-1 detached and gone", &agent, |api| api.get(VAS, "va-1").is_none().then_some(()));
    assert!(published(&rt).is_empty(), "detached in the volume manager too");
    assert!(has_finalizer(&api.get(PVS, "pv-1").expect("pv")), "the live PV keeps its finalizer");

    // The drive goes away: the claim and the pod hear of it.
    drive.detach();
    let events = api.wait_for(Duration::from_secs(15), "condition Events on the claim and the pod", &agent, |api| {
        let events = api.list("/events");
        let claim = events_about(&events, "PersistentVolumeClaim", "claim-1", "VolumeConditionAbnormal").len();
        let pod = events_about(&events, "Pod", "pod-1", "VolumeConditionAbnormal").len();
        (claim > 0 && pod > 0).then_some(events)
    });
    let on_claim = events_about(&events, "PersistentVolumeClaim", "claim-1", "VolumeConditionAbnormal")[0];
    let pulled = api.wait_for(Duration::from_secs(15), "the pulled drive's object marked missing", &agent, |api| {
        drive_object(api).filter(|d| d["status"]["missing"] == true)
    });
    assert_eq!(pulled["status"]["volumes"], json!([id]), "a pulled drive holding a volume keeps its object");
    assert_eq!(pulled["status"]["presence"], "missing", "the PRESENCE column shows it");
    assert_eq!(pulled["spec"]["size"], "1.0 GiB", "the spec the object had is kept");
    assert_eq!(on_claim["type"], "Warning");
    assert_eq!(on_claim["regarding"]["namespace"], "apps");
    assert!(on_claim["note"].as_str().unwrap_or("").contains("missing"), "the note says what is wrong: {on_claim}");

    // A new attachment of the volume whose drive is gone is refused with a clear error,
    // retried on the long terminal delay, not in a storm.
    api.create(VAS, va("va-2", "pv-1"));
    let refused = api.wait_for(Duration::from_secs(10), "va-2 attachError", &agent, |api| {
        api.get(VAS, "va-2").filter(|v| v["status"]["attachError"]["message"].is_string())
    });
    assert_eq!(refused["status"]["attached"], false);
    let message = refused["status"]["attachError"]["message"].as_str().unwrap_or("");
    assert!(message.contains("missing"), "attachError says the drive is missing: {message}");
    // The Event is written right after the status (a second request): wait for it.
    api.wait_for(Duration::from_secs(10), "an AttachFailed Event on va-2", &agent, |api| {
        let events = api.list("/events");
        (!events_about(&events, "VolumeAttachment", "va-2", "AttachFailed").is_empty()).then_some(())
    });
    std::thread::sleep(Duration::from_millis(1500));
    let status_writes = api.log().iter().filter(|l| l.starts_with("PATCH /apis/storage.k8s.io/v1/volumeattachments/va-2/status")).count();
    assert!(status_writes <= 2, "a missing drive is not a retry storm: {status_writes} status writes in 1.5 s");

    // The attachment and then the PV are deleted: both finalizers go, both objects go.
    api.delete(VAS, "va-2");
    api.wait_for(Duration::from_secs(10), "va-2 gone", &agent, |api| api.get(VAS, "va-2").is_none().then_some(()));
    api.delete(PVS, "pv-1");
    api.wait_for(Duration::from_secs(10), "pv-1 released and gone", &agent, |api| api.get(PVS, "pv-1").is_none().then_some(()));

    // The volume on the pulled drive is deleted: the drive's object goes with its last
    // live volume, within the sync's debounce rather than at the 10 s resync.
    let pulled_name = pulled["metadata"]["name"].as_str().expect("object name").to_string();
    rt.block_on(async {
        let mut csi = Csi::connect(&agent).await;
        csi.ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() }).await.expect("delete volume");
    });
    api.wait_for(Duration::from_secs(3), "the pulled drive's object deleted with its last volume", &agent, |api| {
        api.get(DRIVES, &pulled_name).is_none().then_some(())
    });

    // Other drivers' attachments are never touched; another node's gets, from this
    // agent's relay (it holds the cluster duties' Lease), only the label naming its node,
    // and is never attached, finalized or given a status here.
    let mut foreign = va("va-x", "pv-x");
    foreign["spec"]["attacher"] = json!("ebs.csi.aws.com");
    api.create(VAS, foreign);
    let mut elsewhere = va("va-y", "pv-y");
    elsewhere["spec"]["nodeName"] = json!("node-b");
    api.create(VAS, elsewhere);
    let labelled = api.wait_for(Duration::from_secs(5), "va-y labelled with its node", &agent, |api| {
        api.get(VAS, "va-y").filter(|v| v["metadata"]["labels"]["drivelet.io/node"] == "node-b")
    });
    std::thread::sleep(Duration::from_secs(1));
    let touched: Vec<String> = api.log().into_iter().filter(|l| l.contains("/va-x") || l.contains("/va-y")).collect();
    assert_eq!(touched, ["PATCH /apis/storage.k8s.io/v1/volumeattachments/va-y"], "one label patch, nothing else");
    assert!(labelled["metadata"]["finalizers"].is_null() && labelled["status"].is_null(), "only labelled: {labelled}");
    assert_requests_are_permitted(&api);
}

#[test]
fn attachments_waiting_at_start_are_attached_without_a_warning() {
    require_host();
    let tmp = short_tempdir();
    let dir = tmp.path();
    let _drive = LoopDrive::new(dir, "k2.img", 1 << 30);
    let api = FakeApi::start();
    api.create(NODES, json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}}));
    let mut agent = Agent::start(dir, kube_opts(&api, dir));
    let rt = rt();
    let id = rt.block_on(async {
        let mut csi = Csi::connect(&agent).await;
        let r = csi.ctrl.create_volume(create_req("pvc-k2", 64 << 20, mount_cap("ext4"))).await.expect("create");
        r.into_inner().volume.expect("volume").volume_id
    });
    assert_eq!(agent.stop(), 0, "clean stop; log:\n{}", agent.logs());

    // While the agent is down, a pod using the volume is scheduled: at the next start the
    // attachment is waiting, listed before the volume manager has reconciled its store.
    api.create(PVS, pv("pv-1", &id, "claim-1"));
    api.create(VAS, va("va-1", "pv-1"));
    let before = agent.logs().len();
    agent.spawn();
    api.wait_for(Duration::from_secs(10), "va-1 attached after the restart", &agent, |api| {
        api.get(VAS, "va-1").filter(|v| v["status"]["attached"] == true)
    });
    let log = agent.logs();
    let attach_side = |l: &&str| l.contains("\"target\":\"drivelet::actors::attach") || l.contains("\"target\":\"drivelet::k8s::");
    let warnings: Vec<&str> = log[before..].lines().filter(|l| l.contains("\"level\":\"WARN\"")).filter(attach_side).collect();
    assert!(warnings.is_empty(), "a normal start logs no attach warning:\n{}", warnings.join("\n"));
}

#[test]
fn the_agent_leads_the_cluster_duties_hands_them_over_on_sigterm_and_back_deletes_the_volumes_removed_while_its_node_was_gone() {
    require_host();
    let tmp = short_tempdir();
    let dir = tmp.path();
    let _drive = LoopDrive::new(dir, "k9.img", 1 << 30);
    let api = FakeApi::start();
    api.create(NODES, json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}}));
    let mut agent = Agent::start(dir, kube_opts(&api, dir));
    let rt = rt();
    let [removed, kept] = ["pvc-gone", "pvc-kept"].map(|name| {
        rt.block_on(async {
            let mut csi = Csi::connect(&agent).await;
            let r = csi.ctrl.create_volume(create_req(name, 64 << 20, mount_cap("ext4"))).await.expect("create");
            r.into_inner().volume.expect("volume").volume_id
        })
    });

    // The only candidate takes the Lease, and gives it up on SIGTERM.
    api.wait_for(Duration::from_secs(10), "the cluster duties Lease held by this node", &agent, |api| {
        api.get(LEASES, "drivelet-cluster-duties").filter(|l| l["spec"]["holderIdentity"] == NODE)
    });
    assert_eq!(agent.stop(), 0);
    let lease = api.get(LEASES, "drivelet-cluster-duties").expect("the Lease stays");
    assert!(lease["spec"]["holderIdentity"].is_null(), "a clean shutdown gives the Lease up: {lease}");

    // Meanwhile the node was deleted and another agent deleted one volume's Released PV.
    api.create(
        CONFIGMAPS,
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "drivelet-removed-volumes", "namespace": "drivelet-system"},
            "data": {NODE: format!("{removed}\n"), "node-b": "vol-of-node-b\n"}
        }),
    );
    agent.spawn();
    agent.wait_ready();
    let cm = api.wait_for(Duration::from_secs(15), "this node's key of drivelet-removed-volumes cleared", &agent, |api| {
        api.get(CONFIGMAPS, "drivelet-removed-volumes").filter(|cm| cm["data"].get(NODE).is_none())
    });
    assert_eq!(cm["data"]["node-b"], "vol-of-node-b\n", "another node's key is not touched");
    let ids = agent.ctl_volume_ids().expect("ctl volumes");
    assert!(!ids.contains(&removed), "the removed volume is deleted: {ids:?}");
    assert!(ids.contains(&kept), "every other volume stays: {ids:?}");
    let logs = agent.logs();
    assert!(logs.lines().any(|l| l.contains("volume deleted") && l.contains(&removed)), "the deletion is logged");
    assert_requests_are_permitted(&api);
}

#[test]
fn a_volume_whose_pv_is_pinned_to_another_node_gets_its_pv_pinned_here_bound_to_the_same_claim_retain_first() {
    require_host();
    let tmp = short_tempdir();
    let dir = tmp.path();
    let _drive = LoopDrive::new(dir, "k7.img", 1 << 30);
    let api = FakeApi::start();
    api.create(NODES, json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}}));
    let agent = Agent::start(dir, kube_opts(&api, dir));
    let rt = rt();
    // A volume made for PV pv-r and claim apps/data-r, as the provisioner asks with
    // --extra-create-metadata; its PV is pinned to node-2 (its drive came from there).
    let params = [("csi.storage.k8s.io/pv/name", "pv-r"), ("csi.storage.k8s.io/pvc/name", "data-r"), ("csi.storage.k8s.io/pvc/namespace", "apps")];
    let id = rt.block_on(async {
        let mut csi = Csi::connect(&agent).await;
        let r = csi.ctrl.create_volume(vol_req("pv-r", 64 << 20, 0, vec![mount_cap("ext4")], &params)).await.expect("create");
        r.into_inner().volume.expect("volume").volume_id
    });
    api.create(
        "/api/v1/namespaces/apps/persistentvolumeclaims",
        json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data-r", "namespace": "apps"},
            "spec": {"volumeName": "pv-r", "storageClassName": "fast", "accessModes": ["ReadWriteOnce"]},
            "status": {"phase": "Bound"}
        }),
    );
    let mut old = pv("pv-r", &id, "data-r");
    old["metadata"]["finalizers"] = json!(["kubernetes.io/pv-protection", "external-provisioner.volume.kubernetes.io/finalizer"]);
    old["spec"]["claimRef"]["name"] = json!("data-r");
    // The fake API server names each object's uid after it.
    old["spec"]["claimRef"]["uid"] = json!("uid-data-r");
    old["spec"]["persistentVolumeReclaimPolicy"] = json!("Delete");
    old["spec"]["storageClassName"] = json!("fast");
    old["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "topology.drivelet.io/node", "operator": "In", "values": ["node-2"]}]}]}});
    api.create(PVS, old);

    let new = api.wait_for(Duration::from_secs(20), "pv-r pinned to this node", &agent, |api| {
        api.get(PVS, "pv-r").filter(|p| p["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == json!([NODE]))
    });
    assert_eq!(new["spec"]["persistentVolumeReclaimPolicy"], "Delete", "the policy it had: {new}");
    assert_eq!(new["spec"]["claimRef"]["uid"], "uid-data-r", "bound to the same claim");
    assert_eq!(new["spec"]["csi"]["volumeHandle"], json!(id));
    assert_eq!(new["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"], DRIVER);
    assert!(new["metadata"]["annotations"].get("drivelet.io/reclaim-policy-before-rehome").is_none(), "{new}");
    assert_eq!(new["metadata"]["finalizers"], json!(["external-provisioner.volume.kubernetes.io/finalizer"]));
    // Retain came first: no moment existed in which a Delete policy could reach the volume.
    let log = api.log();
    let at = |what: &str| log.iter().position(|l| l.starts_with(what)).unwrap_or_else(|| panic!("{what} in {log:?}"));
    let (retain, delete, create) = (at("PATCH /api/v1/persistentvolumes/pv-r"), at("DELETE /api/v1/persistentvolumes/pv-r"), at("POST /api/v1/persistentvolumes"));
    assert!(retain < delete && delete < create, "Retain, then delete, then create: {log:?}");
    api.wait_for(Duration::from_secs(10), "a VolumeAdopted Event on the claim", &agent, |api| {
        let events = api.list("/events");
        let e = events_about(&events, "PersistentVolumeClaim", "data-r", "VolumeAdopted").first().map(|e| (*e).clone());
        e.filter(|e| e["note"].as_str().is_some_and(|n| n.contains(NODE) && n.contains("node-2")))
    });
    // The next pass finds it here and records the claim's uid and class for the note.
    api.wait_for(Duration::from_secs(20), "the volume's binding recorded", &agent, |_| {
        agent.logs().lines().any(|l| l.contains("binding recorded") && l.contains(&id)).then_some(())
    });
    assert_requests_are_permitted(&api);
}

#[test]
fn a_claim_scheduled_here_is_provisioned_in_process_and_its_released_pv_deleted() {
    require_host();
    let tmp = short_tempdir();
    let dir = tmp.path();
    let _drive = LoopDrive::new(dir, "p1.img", 1 << 30);
    let api = FakeApi::start();
    const CLAIMS: &str = "/api/v1/namespaces/apps/persistentvolumeclaims";
    const CLASSES: &str = "/apis/storage.k8s.io/v1/storageclasses";
    api.create(NODES, json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}}));
    api.create(CLASSES, json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "local"},
        "provisioner": DRIVER, "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer"}));
    let mut agent = Agent::start(dir, kube_opts(&api, dir));
    // The scheduler chose this node for the claim (the relay labels it for the node's watch).
    api.create(CLAIMS, json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": "apps",
            "annotations": {"volume.kubernetes.io/storage-provisioner": DRIVER, "volume.kubernetes.io/selected-node": NODE}},
        "spec": {"storageClassName": "local", "accessModes": ["ReadWriteOnce"], "volumeMode": "Block", "resources": {"requests": {"storage": "64Mi"}}},
        "status": {"phase": "Pending"}}));
    let pv = api.wait_for(Duration::from_secs(15), "the claim's PV written by the agent", &agent, |api| api.get(PVS, "pvc-uid-data"));
    assert_eq!(pv["spec"]["claimRef"]["uid"], "uid-data");
    assert_eq!(pv["spec"]["claimRef"]["namespace"], "apps");
    assert_eq!(pv["spec"]["volumeMode"], "Block");
    assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Delete");
    assert_eq!(pv["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"], DRIVER);
    assert_eq!(pv["metadata"]["labels"]["drivelet.io/node"], NODE);
    assert_eq!(pv["metadata"]["finalizers"], json!(["external-provisioner.volume.kubernetes.io/finalizer"]));
    let id = pv["spec"]["csi"]["volumeHandle"].as_str().expect("a volume handle").to_string();
    let rt = rt();
    let listed = |agent: &Agent| {
        rt.block_on(async {
            let mut csi = Csi::connect(agent).await;
            let r = csi.ctrl.list_volumes(csi::ListVolumesRequest::default()).await.expect("list");
            r.into_inner().entries.into_iter().filter_map(|e| e.volume).map(|v| (v.volume_id, v.capacity_bytes)).collect::<Vec<_>>()
        })
    };
    let volumes = listed(&agent);
    assert_eq!(volumes.len(), 1, "one volume made: {volumes:?}");
    assert_eq!(volumes[0].0, id);
    assert!(volumes[0].1 >= 64 << 20);
    let note = api.wait_for(Duration::from_secs(5), "a ProvisioningSucceeded Event on the claim", &agent, |api| {
        api.list("/events").into_iter().find(|e| e["reason"] == "ProvisioningSucceeded").map(|e| e["note"].as_str().unwrap_or_default().to_string())
    });
    assert!(note.contains("pvc-uid-data") && note.contains("64.0 MiB") && note.contains(NODE), "{note}");

    // The claim that PV was bound to is gone (a new one of that name has another uid):
    // the PV is Released, so its volume is deleted, its finalizer taken off, the PV deleted.
    let mut released = pv.clone();
    released["spec"]["claimRef"]["uid"] = json!("uid-of-the-deleted-claim");
    released["status"] = json!({"phase": "Released"});
    api.create(PVS, released);
    api.wait_for(Duration::from_secs(15), "the Released PV deleted after its volume", &agent, |api| api.get(PVS, "pvc-uid-data").is_none().then_some(()));
    let order: Vec<String> = api.log().into_iter().filter(|l| l.contains("persistentvolumes/pvc-uid-data") && !l.starts_with("GET")).collect();
    assert_eq!(order, ["PATCH /api/v1/persistentvolumes/pvc-uid-data", "DELETE /api/v1/persistentvolumes/pvc-uid-data"], "the finalizer off, then the PV deleted");
    assert!(listed(&agent).is_empty(), "the volume is deleted");
    assert_requests_are_permitted(&api);
}

/// The crash point of the in-process provisioner (`src/k8s/provision/executor.rs`):
/// after CreateVolume, before the PV is written.
pub(crate) const PROVISION_POINTS: &[&str] = &["provision.created"];

/// Killed between CreateVolume and the PV: a claim still there at the restart gets the
/// same volume (one, not two) and its PV; a claim deleted while the agent lay dead leaves
/// no volume behind (nothing can reach it: no PV was ever written, and its uid never
/// comes back), and the first claim's volume is not touched by that.
#[test]
fn a_provisioning_killed_before_its_pv_finishes_for_a_claim_still_there_and_leaves_nothing_for_one_deleted() {
    require_host();
    let tmp = short_tempdir();
    let dir = tmp.path();
    let _drive = LoopDrive::new(dir, "p1.img", 1 << 30);
    let api = FakeApi::start();
    const CLAIMS: &str = "/api/v1/namespaces/apps/persistentvolumeclaims";
    const CLASSES: &str = "/apis/storage.k8s.io/v1/storageclasses";
    api.create(NODES, json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}}));
    api.create(CLASSES, json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "local"},
        "provisioner": DRIVER, "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer"}));
    let claim = |name: &str| json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "apps",
            "annotations": {"volume.kubernetes.io/storage-provisioner": DRIVER, "volume.kubernetes.io/selected-node": NODE}},
        "spec": {"storageClassName": "local", "accessModes": ["ReadWriteOnce"], "volumeMode": "Block", "resources": {"requests": {"storage": "64Mi"}}},
        "status": {"phase": "Pending"}});
    let rt = rt();
    let listed = |agent: &Agent| {
        rt.block_on(async {
            let mut csi = Csi::connect(agent).await;
            let r = csi.ctrl.list_volumes(csi::ListVolumesRequest::default()).await.expect("list");
            let mut names: Vec<String> = r.into_inner().entries.into_iter().filter_map(|e| e.volume).map(|v| v.volume_id).collect();
            names.sort();
            names
        })
    };
    let armed = [("FAILPOINTS", "provision.created=return")];
    let mut agent = Agent::start_with(dir, kube_opts(&api, dir), &armed);

    // The claim stays: at the restart its CreateVolume finds the volume made, and the PV
    // is written for it.
    api.create(CLAIMS, claim("kept"));
    assert!(agent.wait_exit(Duration::from_secs(20)).is_some(), "the agent dies after CreateVolume; log:\n{}", agent.log_tail(40));
    assert!(api.get(PVS, "pvc-uid-kept").is_none(), "no PV before the crash");
    agent.spawn();
    agent.wait_ready();
    let pv = api.wait_for(Duration::from_secs(20), "the kept claim's PV written after the restart", &agent, |api| api.get(PVS, "pvc-uid-kept"));
    let kept = pv["spec"]["csi"]["volumeHandle"].as_str().expect("a volume handle").to_string();
    assert_eq!(listed(&agent), [kept.clone()], "one volume for the claim, made once");
    agent.stop();

    // The claim goes while the agent lies dead: its volume is deleted at the restart.
    agent.spawn_with(&armed);
    agent.wait_ready();
    api.create(CLAIMS, claim("gone"));
    assert!(agent.wait_exit(Duration::from_secs(20)).is_some(), "the agent dies after CreateVolume; log:\n{}", agent.log_tail(40));
    api.delete(CLAIMS, "gone");
    agent.spawn();
    agent.wait_ready();
    api.wait_for(Duration::from_secs(20), "the deleted claim's volume deleted", &agent, |_| {
        agent.logs().lines().any(|l| l.contains("deleted volume pvc-uid-gone") && l.contains("before its PersistentVolume was written")).then_some(())
    });
    assert_eq!(listed(&agent), [kept], "only the kept claim's volume is left");
    assert!(api.get(PVS, "pvc-uid-gone").is_none(), "no PV written for a deleted claim");
    assert!(api.get(PVS, "pvc-uid-kept").is_some());
    assert_requests_are_permitted(&api);
}
