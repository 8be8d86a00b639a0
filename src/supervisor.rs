//! The root supervisor: the one place every actor of a running agent is started, in
//! dependency order, each under an actix `Supervisor`, so an actor that stops on failure
//! is restarted with the same address and rebuilds its state from the host in
//! `restarting()`/`started()`.
//!
//! Rules:
//! - [`start`] wires everything, dependencies passed explicitly as addresses: the core
//!   actors (`src/actors`: inventory, then the volume manager, which waits for the
//!   inventory's first scan before it serves, then the health poller, which reports to
//!   both), then the gRPC front (CSI server, admin socket, and, last of the sockets, the
//!   kubelet registration server, so kubelet finds a CSI socket that answers), then,
//!   when `[kubernetes]` gives it a client, the Kubernetes front (`src/k8s`: attach,
//!   resize and snapshot queues, condition Events, Drive objects, node labels, the cluster duties controller
//!   with `kubernetes.cluster_duties`, and the clean-up of volumes removed while this
//!   node was gone). The fronts know the core
//!   actors by address; the core actors know neither front;
//! - an actor fails by stopping itself (`ctx.stop()`); its supervisor then runs
//!   `restarting()` and `started()` on the same address, and messages sent meanwhile
//!   wait in the mailbox. A panic is not a failure the supervisor can see: the actor's
//!   task dies with it and its address stays closed for good (see the test below), so
//!   actors never panic on purpose;
//! - tests make an actor fail through a fail point named `actor.<name>.stop`
//!   ([`crate::failpoint::injected_failure`]), compiled in only with the `failpoints`
//!   feature and kept apart from the crash points (which kill the process).

use std::sync::Arc;

use actix::prelude::*;
use tokio::net::UnixListener;
use tracing::info;

use crate::actors::health_poller::HealthPoller;
use crate::actors::inventory::DriveInventory;
use crate::actors::volumes::{SubscribeClones, SubscribeConditions, SubscribeMoves};
use crate::actors::volumes::VolumeManager;
use crate::config::Config;
use crate::grpc::registration::{Registrar, RegistrationService, RegistrationState};
use crate::grpc::{admin, CsiFront, Front, Views};
use crate::k8s::attach::{AttachQueue, ManagerBackend, QueueConfig};
use crate::k8s::shell::RetryPolicy;
use crate::k8s::drives::DriveSync;
use crate::k8s::duties;
use crate::k8s::events::clones::CloneEvents;
use crate::k8s::events::moved::MoveEvents;
use crate::k8s::events::{ConditionEvents, ConditionReporter};
use crate::k8s::identity::Identity;
use crate::k8s::resize::{self, ResizeQueue};
use crate::k8s::snapshot::{self, SnapshotQueue};

/// Addresses of the running core actors.
#[derive(Clone)]
pub(crate) struct Actors {
    /// Drive inventory.
    pub inventory: Addr<DriveInventory>,
    /// Volume manager.
    pub volumes: Addr<VolumeManager>,
    /// Health poller. Nothing sends to it through this address; it is held so the
    /// poller lives as long as the agent that started it.
    #[allow(dead_code)]
    pub health: Addr<HealthPoller>,
}

/// The sockets `drivelet run` bound before any actor starts (a bind error is fatal
/// there, with nothing started yet).
pub(crate) struct Sockets {
    /// The CSI socket.
    pub csi: UnixListener,
    /// The admin socket.
    pub admin: UnixListener,
    /// Kubelet's plugin registration socket, with `kubelet.registration`.
    pub registration: Option<UnixListener>,
}

/// What [`start`] started: the addresses the HTTP endpoints ask and shutdown stops.
pub(crate) struct Running {
    /// The core actors.
    pub actors: Actors,
    /// The CSI server.
    pub csi: Addr<CsiFront>,
    /// The admin server's stop signal.
    pub admin_stop: tokio::sync::oneshot::Sender<()>,
    /// The admin server, done once it stopped.
    pub admin_task: tokio::task::JoinHandle<()>,
    /// Kubelet's registration server, with `kubelet.registration`.
    pub registrar: Option<Addr<Registrar>>,
    /// The attach queue, with `[kubernetes]` and `kubernetes.attach`.
    pub attach: Option<Addr<AttachQueue<ManagerBackend>>>,
    /// The cluster duties controller, with `[kubernetes]` and `kubernetes.cluster_duties`;
    /// shut down first, so it hands its Lease over.
    pub duties: Option<duties::controller::Handle>,
}

/// Starts every actor on the current arbiter, in the order of the module rules: core
/// actors, the gRPC front on `sockets`, and the Kubernetes front when `kube` is a client.
pub(crate) fn start(cfg: &Arc<Config>, sockets: Sockets, kube: Option<kube::Client>) -> Running {
    let drives = cfg.drives.clone();
    let own = crate::actors::inventory::classify::Ownership {
        me: crate::disk::note::identity().cloned(),
        known: crate::actors::volumes::startup::known_drives(&cfg.paths.state_dir),
    };
    let inventory = DriveInventory::new(drives, own);
    let scanned = inventory.scan_reader();
    let inventory = Supervisor::start(move |_| inventory);
    let volumes = VolumeManager::new(cfg.volumes.clone(), cfg.paths.state_dir.clone(), inventory.clone(), cfg.health.auto_release);
    let guards = volumes.guards();
    let views = Views { scanned, volumes: volumes.view_reader() };
    if let Some(me) = crate::disk::note::identity() {
        tokio::spawn(crate::actors::volumes::notes::keep_notes(volumes.view_reader(), me.clone()));
    }
    let volumes = Supervisor::start(move |_| volumes);
    let (hcfg, roots, inv, vols) = (cfg.health.clone(), cfg.volumes.allowed_roots.clone(), inventory.clone(), volumes.clone());
    let health = Supervisor::start(move |_| HealthPoller::new(hcfg, roots.clone(), inv, vols, guards.clone()));
    let actors = Actors { inventory, volumes, health };

    let front = Front::new(cfg.clone(), actors.inventory.clone(), actors.volumes.clone(), views);
    let csi = {
        let (f, l) = (front.clone(), sockets.csi);
        Supervisor::start(move |_| CsiFront::new(f, l))
    };
    let (admin_stop, admin_rx) = tokio::sync::oneshot::channel();
    let admin_task = tokio::spawn(admin::serve_admin(front.clone(), sockets.admin, admin_rx));
    info!(socket.path = %cfg.paths.admin_socket.display(), "serving admin");
    // Kubelet's last registration report.
    let registration = RegistrationState::default();
    let registrar = sockets.registration.map(|l| {
        let service = RegistrationService {
            driver: cfg.driver.name.clone(),
            endpoint: cfg.paths.csi_socket.clone(),
            state: registration.clone(),
        };
        let path = cfg.registration_socket();
        Supervisor::start(move |_| Registrar::new(service, path, l))
    });

    let (attach, duties) = match kube {
        Some(client) => start_kubernetes(cfg, client, &actors, &front),
        None => (None, None),
    };
    Running { actors, csi, admin_stop, admin_task, registrar, attach, duties }
}

/// What [`start_kubernetes`] hands back: the attach queue and the duties controller.
type KubernetesParts = (Option<Addr<AttachQueue<ManagerBackend>>>, Option<duties::controller::Handle>);

/// The Kubernetes front, part of [`start`]: what `[kubernetes]` turns on, the attach
/// queue (its address is returned), the resize and snapshot queues, this node's CSIStorageCapacity objects (from `front`'s
/// GetCapacity), condition Events, Drive objects, node labels, the
/// cluster duties (their controller is returned), and, always, the clean-up of volumes
/// removed while this node was gone and the re-homing of the claims of the volumes this
/// node serves.
fn start_kubernetes(cfg: &Config, client: kube::Client, actors: &Actors, front: &Front) -> KubernetesParts {
    let k = &cfg.kubernetes;
    let identity = Identity { driver: cfg.driver.name.clone(), node: cfg.driver.node_name.clone() };
    // This node's PVs, claims and pods, watched once, read by the Events, the Drive sync
    // and re-homing instead of requests.
    let cache = crate::k8s::cache::NodeCache::start(&client, &cfg.driver.node_name);
    // The attach, resize and snapshot queues: one shell each, configured alike.
    let qcfg = QueueConfig { identity: identity.clone(), policy: RetryPolicy::from_config(k), resync: k.resync_interval };
    let mut attach = None;
    if k.attach {
        let (c, q, backend) = (client.clone(), qcfg.clone(), ManagerBackend::new(actors.volumes.clone()));
        attach = Some(Supervisor::start(move |_| AttachQueue::new(c, q, backend)));
    }
    if k.resize {
        let (c, q, backend) = (client.clone(), qcfg.clone(), resize::ManagerBackend::new(actors.volumes.clone()));
        Supervisor::start(move |_| ResizeQueue::new(c, q, backend));
    }
    if k.snapshots {
        let (c, q, backend) = (client.clone(), qcfg.clone(), snapshot::ManagerBackend::new(actors.volumes.clone()));
        Supervisor::start(move |_| SnapshotQueue::new(c, q, backend));
    }
    if k.provision {
        let (c, q, backend, topology) =
            (client.clone(), qcfg.clone(), crate::k8s::provision::backend::ServiceBackend::new(front.clone()), cfg.topology_segments());
        Supervisor::start(move |_| crate::k8s::provision::ProvisionQueue::new(c, q, backend.clone(), topology.clone()));
    }
    if k.capacity {
        let me = crate::k8s::capacity::Me {
            driver: cfg.driver.name.clone(),
            node: cfg.driver.node_name.clone(),
            namespace: k.namespace.clone(),
            segments: cfg.topology_segments(),
        };
        let backend = crate::k8s::capacity::backend::FrontBackend::new(front);
        tokio::spawn(crate::k8s::capacity::controller::run(client.clone(), me, backend, qcfg.policy));
    }
    if k.events {
        let reporter = ConditionReporter::new(client.clone(), identity.clone()).with_cache(cache.clone());
        let interval = k.event_interval;
        let events = Supervisor::start(move |_| ConditionEvents::new(reporter, interval));
        actors.volumes.do_send(SubscribeConditions(events.recipient()));
        let (c, id, nc) = (client.clone(), identity.clone(), cache.clone());
        let moves = Supervisor::start(move |_| MoveEvents::new(c, id).with_cache(nc.clone()));
        actors.volumes.do_send(SubscribeMoves(moves.recipient()));
        let (c, id) = (client.clone(), identity.clone());
        let clones = Supervisor::start(move |_| CloneEvents::new(c, id));
        actors.volumes.do_send(SubscribeClones(clones.recipient()));
    }
    if k.drive_objects {
        let (c, node, inv, vols, resync) =
            (client.clone(), cfg.driver.node_name.clone(), actors.inventory.clone(), actors.volumes.clone(), k.drive_resync_interval);
        let driver = cfg.driver.name.clone();
        let retry = RetryPolicy::from_config(k);
        let nc = cache.clone();
        Supervisor::start(move |_| DriveSync::new(c, node, &driver, inv, vols, resync, retry).with_cache(nc.clone()));
    }
    if k.label_node {
        let labels = cfg.topology_segments();
        tokio::spawn(crate::k8s::node::label_node(client.clone(), cfg.driver.node_name.clone(), labels, qcfg.policy));
    }
    if cfg.drives.adopt_from_deleted_nodes {
        if let Some(me) = crate::disk::note::identity() {
            tokio::spawn(crate::k8s::auto_adopt::run(client.clone(), actors.inventory.clone(), me.clone()));
        }
    }
    let duties = k.cluster_duties.then(|| duties::controller::start(client.clone(), identity.clone(), k.namespace.clone()));
    let backend = duties::returned::ManagerBackend::new(actors.volumes.clone());
    tokio::spawn(duties::returned::run(client.clone(), k.namespace.clone(), cfg.driver.node_name.clone(), backend));
    // The claims of the volumes this node serves follow them here (an adopted drive's).
    let backend = crate::k8s::rehome::executor::ManagerBackend::new(actors.volumes.clone());
    tokio::spawn(crate::k8s::rehome::executor::run(client, identity.clone(), backend, Some(cache)));
    info!(attach = k.attach, provision = k.provision, resize = k.resize, snapshots = k.snapshots, capacity = k.capacity, events = k.events, drive_objects = k.drive_objects, label_node = k.label_node,
        cluster_duties = k.cluster_duties, "kubernetes integration started");
    (attach, duties)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use actix::prelude::*;

    /// An actor that fails as told and counts its restarts.
    struct Flaky(Arc<AtomicUsize>);

    impl Actor for Flaky {
        type Context = Context<Self>;
    }

    impl Supervised for Flaky {
        fn restarting(&mut self, _: &mut Context<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[derive(Message)]
    #[rtype(result = "u32")]
    enum Ask {
        Answer,
        Stop,
        Panic,
    }

    impl Handler<Ask> for Flaky {
        type Result = u32;
        fn handle(&mut self, m: Ask, ctx: &mut Context<Self>) -> u32 {
            match m {
                Ask::Answer => 42,
                Ask::Stop => {
                    ctx.stop();
                    0
                }
                Ask::Panic => panic!("handler panics"),
            }
        }
    }

    #[test]
    fn a_stopping_actor_is_restarted_on_its_address_but_a_panicking_one_is_gone() {
        let restarts = Arc::new(AtomicUsize::new(0));
        let seen = restarts.clone();
        let sys = actix::System::new();
        let (after_stop, after_panic) = sys.block_on(async move {
            let addr = Supervisor::start(move |_| Flaky(seen));
            assert_eq!(addr.send(Ask::Answer).await.ok(), Some(42));
            let _ = addr.send(Ask::Stop).await;
            let after_stop = addr.send(Ask::Answer).await.ok();
            let _ = addr.send(Ask::Panic).await;
            let after_panic = addr.send(Ask::Answer).await.ok();
            (after_stop, after_panic)
        });
        assert_eq!(after_stop, Some(42), "a stopped actor answers again after its restart");
        assert_eq!(restarts.load(Ordering::SeqCst), 1, "restarting() ran once, for the stop");
        assert_eq!(after_panic, None, "a panicking actor is not restarted: its address is closed");
    }
}
