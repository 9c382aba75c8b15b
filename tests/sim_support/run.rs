//! The loop both simulations run: wait for the next thing that happens (a store revision
//! on the fault-free watch, an answer to a spawned call, a command on a stream, a step on
//! the agenda), hand it to the backend, let every task woken at this instant run and
//! deliver what they produce, then let the backend check its invariants for the instant.

use std::future::{Future, poll_fn};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kafka_assigner::coordinator::CoordinatorError;
use kafka_assigner::proto::v1::AssignmentCommand;
use kafka_assigner::store::WatchBatch;
use tokio::time::Instant;

use super::world::{Backend, Open, World};

/// Scheduler rounds let pass before the loop looks whether the instant is over: every task
/// woken at this instant (a watch batch crosses a few tasks before a relay sends) has run
/// by then.
const SETTLE_ROUNDS: usize = 24;

/// A command of a stream, its error end, or its clean end (`None`).
pub type Item = Option<Result<AssignmentCommand, CoordinatorError>>;

/// A simulation the shared loop drives.
pub trait Driven {
    /// The backend of its [`World`].
    type K: Backend;
    /// Its world.
    fn world(&mut self) -> &mut World<Self::K>;
    /// A revision of the store, as the fault-free watch saw it.
    fn on_truth(&mut self, batch: WatchBatch) -> Result<(), String>;
    /// The answer of a spawned call.
    fn on_reply(&mut self, reply: <Self::K as Backend>::Reply);
    /// An item of consumer `c`'s open stream `inc`.
    fn on_item(&mut self, inc: u64, c: usize, item: Item) -> Result<(), String>;
    /// An item of consumer `c`'s half-open stream `inc`.
    fn on_zombie(&mut self, inc: u64, c: usize, item: Item);
    /// Does a step of the agenda.
    fn act(&mut self, what: <Self::K as Backend>::Agenda) -> impl Future<Output = Result<(), String>>;
    /// The instant is over: the invariants that hold at the end of every instant.
    fn end_of_instant(&mut self) -> Result<(), String>;
}

/// What woke the loop.
enum Woke<R> {
    Truth(Option<Result<WatchBatch, String>>),
    Reply(R),
    Item(u64, usize, Item),
    Zombie(u64, usize, Item),
    Agenda,
}

/// Runs `sim` until its world is done; `Err` names the broken invariant.
pub async fn run<S: Driven>(sim: &mut S) -> Result<(), String> {
    while !sim.world().done {
        let world = sim.world();
        let next = world.agenda.first_key_value().map(|((t, _), _)| *t);
        let next = next.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        let woke = tokio::select! {
            biased;
            batch = world.god.next() => Woke::Truth(batch.map(|b| b.map_err(|e| e.to_string()))),
            Some(reply) = world.replies.recv() => Woke::Reply(reply),
            (inc, c, item) = poll_fn(|cx| poll_streams(&mut world.open, cx)) => Woke::Item(inc, c, item),
            (inc, c, item) = poll_fn(|cx| poll_streams(&mut world.zombies, cx)) => Woke::Zombie(inc, c, item),
            () = tokio::time::sleep_until(next) => Woke::Agenda,
        };
        handle(sim, woke).await?;
        settle(sim).await?;
        sim.end_of_instant()?;
    }
    Ok(())
}

async fn handle<S: Driven>(sim: &mut S, woke: Woke<<S::K as Backend>::Reply>) -> Result<(), String> {
    match woke {
        Woke::Truth(Some(Ok(batch))) => sim.on_truth(batch)?,
        Woke::Truth(Some(Err(e))) => return Err(format!("the fault-free watch failed: {e}")),
        Woke::Truth(None) => return Err("the fault-free watch ended".into()),
        Woke::Reply(reply) => sim.on_reply(reply),
        Woke::Item(inc, c, item) => sim.on_item(inc, c, item)?,
        Woke::Zombie(inc, c, item) => sim.on_zombie(inc, c, item),
        Woke::Agenda => {
            let now = Instant::now();
            while let Some(what) = sim.world().due(now) {
                sim.act(what).await?;
            }
        }
    }
    Ok(())
}

/// Lets every task woken at this instant run, delivering what they produce, until nothing
/// more comes: then the instant is over.
async fn settle<S: Driven>(sim: &mut S) -> Result<(), String> {
    loop {
        for _ in 0..SETTLE_ROUNDS {
            tokio::task::yield_now().await;
        }
        let mut any = false;
        while let Some(batch) = sim.world().god.next().now_or_never() {
            any = true;
            handle(sim, Woke::Truth(batch.map(|b| b.map_err(|e| e.to_string())))).await?;
        }
        while let Ok(reply) = sim.world().replies.try_recv() {
            any = true;
            sim.on_reply(reply);
        }
        while let Some((inc, c, item)) = poll_fn(|cx| poll_streams(&mut sim.world().open, cx)).now_or_never()
        {
            any = true;
            sim.on_item(inc, c, item)?;
        }
        while let Some((inc, c, item)) =
            poll_fn(|cx| poll_streams(&mut sim.world().zombies, cx)).now_or_never()
        {
            any = true;
            sim.on_zombie(inc, c, item);
        }
        if !any {
            return Ok(());
        }
    }
}

/// Polls the streams in order; the first with an item wins.
fn poll_streams(streams: &mut [Open], cx: &mut Context<'_>) -> Poll<(u64, usize, Item)> {
    for (inc, consumer, stream) in streams.iter_mut() {
        if let Poll::Ready(item) = stream.poll_next_unpin(cx) {
            return Poll::Ready((*inc, *consumer, item));
        }
    }
    Poll::Pending
}
