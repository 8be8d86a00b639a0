//! The one fake API server of the Kubernetes front's tests (kube-rs's
//! `tower_test::mock::pair`, as in kube-rs's controller example): a [`kube::Client`] for
//! the code under test, and the test's end of it, which takes each request in order,
//! checks it and answers it. Every test of this front that needs an API server uses it
//! (the executors', the shell's, the controllers', the Drive sync's, and
//! `kubectl drivelet`'s); no test builds a server of its own.
//!
//! Rules:
//! - Every request is checked for method and path (the whole path with its query, or
//!   the path alone where the query is not the point) and its JSON body is handed to the
//!   test, which checks it and answers with [`respond`] or [`respond_error`].
//! - No request may come that the script does not expect: [`FakeApi::assert_no_more_requests`]
//!   at the end, [`FakeApi::is_quiet`] between steps (time is paused, so "not yet" is
//!   exact), [`FakeApi::assert_quiet`] for actors that keep running.
//! - [`fake_api`] hands every request to the test. [`fake_api_serving`] answers the lists
//!   and watches of the resources it is given in the background (an actor's watches come
//!   and go on their own) and hands every other request to the test.
//!   [`fake_api_serving_events`] also answers every Event written in the background and
//!   records it ([`FakeApi::events`], [`FakeApi::event_reasons`]), for the controllers
//!   whose tests check the Events once at the end rather than step by step (the resize
//!   and snapshot queues).
//! - A watch the script has no more answers for is held open, never answered; a list
//!   the script has no answer for fails the test.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use http::{HeaderMap, Method, Request, Response};
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tower_test::mock::{self, Handle, SendResponse};

/// The test's way to answer one request.
pub(crate) type Reply = SendResponse<Response<Body>>;

/// One request as the fake API server received it.
pub(crate) struct Call {
    pub(crate) method: Method,
    /// Path and query.
    pub(crate) uri: String,
    pub(crate) headers: HeaderMap,
    /// The JSON body; `Null` when there is none.
    pub(crate) body: Value,
    pub(crate) reply: Reply,
}

impl Call {
    /// The path without the query.
    pub(crate) fn path(&self) -> &str {
        self.uri.split('?').next().unwrap_or("")
    }

    async fn read(request: Request<Body>, reply: Reply) -> Call {
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.expect("request body");
        let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).expect("JSON body") };
        Call { method: parts.method, uri: parts.uri.to_string(), headers: parts.headers, body, reply }
    }
}

/// What the fake API server serves for one resource under [`fake_api_serving`]: list
/// answers and watch bodies (events, one per line), in order; once the script runs out,
/// watches are held open and never answered.
#[derive(Default)]
pub(crate) struct Script {
    pub(crate) lists: VecDeque<Value>,
    pub(crate) watches: VecDeque<Vec<Value>>,
}

enum Source {
    /// Every request comes to the test.
    Direct(Handle<Request<Body>, Response<Body>>),
    /// Requests the background server does not answer.
    Served(mpsc::UnboundedReceiver<Call>),
}

/// The test's end of the fake API server.
pub(crate) struct FakeApi {
    source: Source,
    /// `METHOD path?query` of every request, served or not (under [`fake_api_serving`]).
    requests: Arc<Mutex<Vec<String>>>,
    /// The bodies of the Events written, in order (under [`fake_api_serving_events`]).
    events: Arc<Mutex<Vec<Value>>>,
}

/// A client whose every request comes to the test.
pub(crate) fn fake_api() -> (Client, FakeApi) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), FakeApi { source: Source::Direct(handle), requests: Arc::default(), events: Arc::default() })
}

/// A client whose lists and watches (GET) of each `(collection path, script)` are
/// answered from the script in the background; every other request comes to the test.
pub(crate) fn fake_api_serving(scripts: Vec<(&'static str, Script)>) -> (Client, FakeApi) {
    serve(scripts, false)
}

/// As [`fake_api_serving`], and every Event written (a request other than a GET whose
/// path names `events`) is answered with its own body in the background and recorded
/// ([`FakeApi::events`]): for controllers whose Events are checked at the end, not step
/// by step.
pub(crate) fn fake_api_serving_events(scripts: Vec<(&'static str, Script)>) -> (Client, FakeApi) {
    serve(scripts, true)
}

/// The background server of [`fake_api_serving`] and [`fake_api_serving_events`].
fn serve(scripts: Vec<(&'static str, Script)>, record_events: bool) -> (Client, FakeApi) {
    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let (tx, rx) = mpsc::unbounded_channel();
    let (requests, events) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
    let (log, recorded) = (requests.clone(), events.clone());
    tokio::spawn(async move {
        let mut scripts = scripts;
        let mut held = Vec::new();
        while let Some((request, reply)) = handle.next_request().await {
            let uri = request.uri().to_string();
            let path = request.uri().path().to_string();
            let method = request.method().clone();
            log.lock().expect("log").push(format!("{method} {uri}"));
            let script = scripts.iter_mut().find(|(p, _)| *p == path && method == Method::GET).map(|(_, s)| s);
            match script {
                Some(script) if uri.contains("watch=true") => match script.watches.pop_front() {
                    Some(events) => {
                        let mut body = Vec::new();
                        for e in events {
                            body.extend(serde_json::to_vec(&e).expect("event"));
                            body.push(b'\n');
                        }
                        reply.send_response(Response::builder().body(Body::from(body)).expect("response"));
                    }
                    None => held.push(reply),
                },
                Some(script) => {
                    let answer = script.lists.pop_front().expect("the script has a list answer for every list");
                    respond(reply, &answer);
                }
                None if record_events && method != Method::GET && path.contains("/events") => {
                    let call = Call::read(request, reply).await;
                    recorded.lock().expect("events").push(call.body.clone());
                    respond(call.reply, &call.body);
                }
                None => tx.send(Call::read(request, reply).await).expect("the test is listening"),
            }
        }
    });
    (Client::new(service, "default"), FakeApi { source: Source::Served(rx), requests, events })
}

impl FakeApi {
    /// The next request (under [`fake_api_serving`], the next one not served); `what`
    /// says what the test waits for, should none come.
    pub(crate) async fn next(&mut self, what: &str) -> Call {
        match &mut self.source {
            Source::Direct(handle) => {
                let (request, reply) = handle.next_request().await.expect(what);
                Call::read(request, reply).await
            }
            Source::Served(calls) => tokio::time::timeout(Duration::from_secs(3600), calls.recv())
                .await
                .unwrap_or_else(|_| panic!("{what}: no request within the hour"))
                .expect("the server runs"),
        }
    }

    /// Waits for the next request, checks its method and whole path with query, and
    /// returns its JSON body.
    pub(crate) async fn expect(&mut self, method: Method, uri: &str) -> (Value, Reply) {
        let call = self.next("the client made no request").await;
        assert_eq!(call.method, method, "method of {}", call.uri);
        assert_eq!(call.uri, uri);
        (call.body, call.reply)
    }

    /// Waits for the next request, checks its method and path (the query is not
    /// compared), and returns its JSON body.
    pub(crate) async fn expect_path(&mut self, method: Method, path: &str) -> (Value, Reply) {
        let call = self.next("the client made no request").await;
        assert_eq!((&call.method, call.path()), (&method, path), "request {}", call.uri);
        (call.body, call.reply)
    }

    /// Whether no request is waiting now.
    pub(crate) fn is_quiet(&mut self) -> bool {
        match &mut self.source {
            Source::Direct(handle) => handle.poll_request().is_pending(),
            Source::Served(calls) => calls.try_recv().is_err(),
        }
    }

    /// Fails on any request the script did not expect (a closed client is fine).
    pub(crate) fn assert_no_more_requests(&mut self, why: &str) {
        match &mut self.source {
            Source::Direct(handle) => {
                if let Poll::Ready(Some((request, _))) = handle.poll_request() {
                    panic!("{why}: unexpected {} {}", request.method(), request.uri());
                }
            }
            Source::Served(calls) => {
                if let Ok(call) = calls.try_recv() {
                    panic!("{why}: unexpected {} {}", call.method, call.uri);
                }
            }
        }
    }

    /// Lets 30 s of (paused) time pass, then fails on any request the script did not
    /// expect: for actors that keep running.
    pub(crate) async fn assert_quiet(&mut self) {
        tokio::time::sleep(Duration::from_secs(30)).await;
        self.assert_no_more_requests("after everything settled");
    }

    /// The bodies of the Events written so far (under [`fake_api_serving_events`]).
    pub(crate) fn events(&self) -> Vec<Value> {
        self.events.lock().expect("events").clone()
    }

    /// The reasons of the Events written so far, in order.
    pub(crate) fn event_reasons(&self) -> Vec<String> {
        self.events().iter().map(|e| e["reason"].as_str().unwrap_or("").to_string()).collect()
    }

    /// Every request so far (served ones too), as `METHOD path?query`.
    pub(crate) fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("log").clone()
    }

    /// How many requests so far (served ones too) start with `what` (`"GET /api/..."`).
    pub(crate) fn count(&self, what: &str) -> usize {
        self.requests.lock().expect("log").iter().filter(|r| r.starts_with(what)).count()
    }
}

/// Answers with `object` as JSON.
pub(crate) fn respond(reply: Reply, object: &impl serde::Serialize) {
    let bytes = serde_json::to_vec(object).expect("response serializes");
    reply.send_response(Response::builder().body(Body::from(bytes)).expect("response"));
}

/// Answers with an API error: HTTP `code` and a `Status` saying `message`.
pub(crate) fn respond_error(reply: Reply, code: u16, message: &str) {
    let status = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": "InternalError", "code": code,
    });
    let bytes = serde_json::to_vec(&status).expect("status serializes");
    reply.send_response(Response::builder().status(code).body(Body::from(bytes)).expect("response"));
}

/// Answers 404 as the API server does for a missing object (reason `NotFound`, which
/// kube's `get_opt` reads as "no such object").
pub(crate) fn respond_not_found(reply: Reply, message: &str) {
    let status = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": "NotFound", "code": 404,
    });
    let bytes = serde_json::to_vec(&status).expect("status serializes");
    reply.send_response(Response::builder().status(404).body(Body::from(bytes)).expect("response"));
}

/// A list of `kind` objects at resource version `rv`, as the API server answers a list.
pub(crate) fn list_of(kind: &str, api_version: &str, rv: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": api_version, "kind": format!("{kind}List"), "metadata": {"resourceVersion": rv}, "items": items})
}

/// The node affinity drivelet's PVs carry: required, `topology.drivelet.io/node In [node]`.
pub(crate) fn pinned_to(node: &str) -> k8s_openapi::api::core::v1::VolumeNodeAffinity {
    use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, VolumeNodeAffinity};
    VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(vec![NodeSelectorRequirement {
                    key: crate::TOPOLOGY_NODE_KEY.into(),
                    operator: "In".into(),
                    values: Some(vec![node.into()]),
                }]),
                ..Default::default()
            }],
        }),
    }
}
