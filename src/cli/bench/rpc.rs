//! `drivelet bench rpc`: each cheap RPC in its own phase of `--duration`, every caller
//! calling it back to back after one untimed warm-up call; an RPC the endpoint does not
//! advertise is skipped and listed as skipped.

use super::*;

/// A cheap RPC for `rpc` mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Rpc {
    /// Identity GetPluginInfo: the baseline, a call answered from configuration alone
    /// (in drivelet, with no actor and no disk behind it), on the same server stack.
    GetPluginInfo,
    /// Identity Probe.
    Probe,
    /// NodeGetInfo.
    NodeGetInfo,
    /// NodeGetCapabilities.
    NodeGetCapabilities,
    /// GetCapacity with no parameters.
    GetCapacity,
    /// The first page of ListVolumes.
    ListVolumes,
}

impl Rpc {
    /// Every RPC of `rpc` mode, in the order they run.
    pub const ALL: [Rpc; 6] =
        [Rpc::GetPluginInfo, Rpc::Probe, Rpc::NodeGetInfo, Rpc::NodeGetCapabilities, Rpc::GetCapacity, Rpc::ListVolumes];

    /// CSI name.
    pub fn name(self) -> &'static str {
        match self {
            Rpc::GetPluginInfo => "GetPluginInfo",
            Rpc::Probe => "Probe",
            Rpc::NodeGetInfo => "NodeGetInfo",
            Rpc::NodeGetCapabilities => "NodeGetCapabilities",
            Rpc::GetCapacity => "GetCapacity",
            Rpc::ListVolumes => "ListVolumes",
        }
    }

    /// Why the endpoint cannot be asked, given its controller capabilities.
    pub(super) fn unsupported(self, caps: &HashSet<CtrlCap>) -> Option<String> {
        match self {
            Rpc::GetCapacity if !caps.contains(&CtrlCap::GetCapacity) => Some("GET_CAPACITY is not advertised".into()),
            Rpc::ListVolumes if !caps.contains(&CtrlCap::ListVolumes) => Some("LIST_VOLUMES is not advertised".into()),
            _ => None,
        }
    }
}

/// `drivelet bench rpc`.
#[derive(Debug, Clone)]
pub struct RpcOptions {
    /// Shared settings.
    pub common: Common,
    /// How long each RPC is called.
    pub duration: Duration,
    /// Which RPCs (empty: all).
    pub rpcs: Vec<Rpc>,
    /// `max_entries` of ListVolumes.
    pub page_size: i32,
}

/// `drivelet bench rpc`: every endpoint, every RPC, one phase each.
pub async fn run_rpc(o: &RpcOptions) -> Result<Report, BenchError> {
    check_common(&o.common)?;
    if o.page_size < 0 {
        return Err(BenchError::Usage("--page-size must not be negative".into()));
    }
    let mut endpoints = Vec::new();
    for t in &o.common.endpoints {
        endpoints.push(rpc_endpoint(o, t).await?);
    }
    Ok(Report {
        mode: "rpc".into(),
        concurrency: o.common.concurrency,
        connections: o.common.connections.as_str().into(),
        duration_s: Some(o.duration.as_secs_f64()),
        count: None,
        endpoints,
    })
}

async fn rpc_endpoint(o: &RpcOptions, t: &Target) -> Result<EndpointReport, BenchError> {
    let chans = channels(t, o.common.concurrency, o.common.connections).await?;
    let mut first = Clients::new(chans[0].clone());
    let driver = driver_name(&mut first, t, o.common.timeout).await?;
    let caps = controller_caps(&mut first, o.common.timeout).await;
    let t0 = Instant::now();
    let mut rep = EndpointReport { label: t.label.clone(), endpoint: t.path.display().to_string(), driver, ..Default::default() };
    let rpcs = if o.rpcs.is_empty() { Rpc::ALL.to_vec() } else { o.rpcs.clone() };
    for rpc in rpcs {
        if let Some(reason) = rpc.unsupported(&caps) {
            rep.skipped.push(Skipped { name: rpc.name().into(), reason });
            continue;
        }
        rep.calls.push(rpc_phase(t, &chans, rpc, o).await);
    }
    rep.elapsed_s = t0.elapsed().as_secs_f64();
    rep.errors = rep.calls.iter().map(|c| c.errors).sum();
    Ok(rep)
}

async fn rpc_phase(t: &Target, chans: &[Channel], rpc: Rpc, o: &RpcOptions) -> CallStats {
    let progress = Arc::new(Progress::default());
    let _ticker = Ticker::start(format!("{} {}", t.label, rpc.name()), "calls", progress.clone());
    let start = Arc::new(tokio::sync::Barrier::new(chans.len()));
    let mut callers = Vec::with_capacity(chans.len());
    for ch in chans {
        let (ch, start, progress) = (ch.clone(), start.clone(), progress.clone());
        let (duration, limit, page) = (o.duration, o.common.timeout, o.page_size);
        callers.push(tokio::spawn(async move {
            let mut c = Clients::new(ch);
            // Untimed: the connection is up and warm before the phase starts.
            let _ = c.call(rpc, limit, page).await;
            start.wait().await;
            let t0 = Instant::now();
            let mut tally = Tally::default();
            while t0.elapsed() < duration {
                let (d, r) = c.call(rpc, limit, page).await;
                progress.add(r.is_ok());
                match r {
                    Ok(()) => tally.ok(d),
                    Err(f) => tally.err(f.code),
                }
            }
            (tally, t0.elapsed())
        }));
    }
    let mut all = Tally::default();
    let mut secs = 0f64;
    for c in callers {
        match c.await {
            Ok((tally, took)) => {
                all.merge(&tally);
                secs = secs.max(took.as_secs_f64());
            }
            Err(e) => all.err(if e.is_panic() { "PANIC" } else { "CANCELLED" }),
        }
    }
    all.stats(rpc.name(), secs)
}
