//! One arbiter connection as an actor: it owns the QUIC connection, does
//! the handshake (Hello, then Welcome or Refused), writes the session
//! stream in order, reads it on its own (a frame read is never cancelled
//! half-way), and sends each request on a stream of its own. Everything it
//! hears goes to the agent's state machine as an `Input`; it decides
//! nothing.
//!
//! It also watches for a replica that died silently: a message it sends
//! must be followed, within `agent.arbiter_silence_ms`, by at least one
//! datagram from the replica (a live one acknowledges within a round
//! trip), or the session ends and the agent moves on to the next replica.

use std::time::{Duration, Instant};

use actix::prelude::*;
use rollcall_leases::client::{ArbiterClient, ArbiterConn, ClientError, SessionReader};
use rollcall_leases::protocol::{Request, SessionDown, SessionUp};
use tokio::sync::mpsc;

use crate::agent_state::{Input, SessionId};

/// Send one message on the session stream.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SendUp(pub SessionUp);

/// Send a request on a stream of its own.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Ask {
    /// Its number.
    pub request: u64,
    /// What to ask.
    pub body: Request,
}

/// Close the connection with a reason.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CloseSession(pub String);

/// One arbiter connection: handshake, Hello and Welcome, then the session
/// stream both ways and requests on streams of their own.
pub struct SessionActor {
    session: SessionId,
    address: String,
    client: ArbiterClient,
    hello: SessionUp,
    agent: Recipient<Input>,
    conn: Option<ArbiterConn>,
    up: Option<mpsc::UnboundedSender<SessionUp>>,
    ended: bool,
    /// The earliest message sent and not yet followed by a datagram.
    watch: Option<Watch>,
}

/// A sent message waiting for a sign of life from the replica.
struct Watch {
    /// Datagrams heard on the connection when it was sent.
    heard: u64,
    /// The timer that ends the session if none arrives.
    timer: SpawnHandle,
}

/// A watch whose timer fired later than this decides nothing: the agent
/// was paused or starved, and the replica's answer may be there unread.
const LATE: Duration = Duration::from_millis(rollcall_config::SILENCE_CHECK_LATE_MS);

/// How long a check that found nothing waits before it decides, so that
/// a datagram already in the socket is read first.
const CONFIRM: Duration = Duration::from_millis(50);

impl SessionActor {
    /// Session `session` with the arbiter at `address`, opened with `hello`.
    pub fn new(
        session: SessionId,
        address: String,
        client: ArbiterClient,
        hello: SessionUp,
        agent: Recipient<Input>,
    ) -> Self {
        SessionActor {
            session,
            address,
            client,
            hello,
            agent,
            conn: None,
            up: None,
            ended: false,
            watch: None,
        }
    }

    /// A message is being sent: unless an earlier one is still waiting for
    /// a datagram, this one must see one within the client's
    /// `arbiter_silence`.
    fn watch(&mut self, ctx: &mut Context<Self>) {
        let Some(conn) = &self.conn else {
            return;
        };
        let heard = conn.datagrams_heard();
        if let Some(watch) = self.watch.take() {
            if watch.heard == heard {
                // The earlier message waits still: its deadline is sooner.
                self.watch = Some(watch);
                return;
            }
            ctx.cancel_future(watch.timer);
        }
        let silence = self.client.arbiter_silence();
        let due = Instant::now() + silence;
        let timer = ctx.run_later(silence, move |act, ctx| {
            let Some(watch) = act.watch.take() else {
                return;
            };
            let late = Instant::now().saturating_duration_since(due) > LATE;
            if act.heard_since(watch.heard) || late {
                return;
            }
            // A datagram that arrived in the same wake-up as this timer
            // (the agent resuming from a pause) may not be read yet: look
            // once more after the endpoint's driver had its turn.
            ctx.run_later(CONFIRM, move |act, ctx| {
                if act.heard_since(watch.heard) {
                    return;
                }
                act.end(
                    format!(
                        "the arbiter sent nothing back within agent.arbiter_silence_ms ({} ms) of a message: its host is presumed gone",
                        silence.as_millis()
                    ),
                    ctx,
                );
            });
        });
        self.watch = Some(Watch { heard, timer });
    }

    /// Whether a datagram arrived since the count was `heard`.
    fn heard_since(&self, heard: u64) -> bool {
        self.conn
            .as_ref()
            .is_none_or(|c| c.datagrams_heard() != heard)
    }
}

impl Actor for SessionActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let (client, address, hello) = (
            self.client.clone(),
            self.address.clone(),
            self.hello.clone(),
        );
        let handshake = async move {
            let conn = client.connect(&address).await?;
            let (writer, mut reader) = conn.open_session(&hello).await?;
            match reader.next().await? {
                SessionDown::Welcome {
                    lease,
                    ttl_ms,
                    revision,
                    catalog,
                    ..
                } => Ok((conn, writer, reader, lease, ttl_ms, (revision, catalog))),
                SessionDown::Refused { reason } => Err(ClientError::Connection(format!(
                    "arbiter refused the session: {reason}"
                ))),
                other => Err(ClientError::Connection(format!(
                    "expected Welcome, got {other:?}"
                ))),
            }
        };
        ctx.spawn(handshake.into_actor(self).map(|result, act, ctx| {
            let (conn, mut writer, reader, lease, ttl_ms, (revision, catalog)) = match result {
                Ok(up) => up,
                Err(e) => return act.end(e.to_string(), ctx),
            };
            // A handshake checks the arbiter's certificate once: the
            // session ends when it expires, and the next one checks again.
            let expiring = conn.clone();
            ctx.spawn(
                async move { expiring.certificate_expired().await }
                    .into_actor(act)
                    .map(|reason, act, ctx| act.end(reason, ctx)),
            );
            act.conn = Some(conn);
            let (tx, mut rx) = mpsc::unbounded_channel::<SessionUp>();
            let tx_probe = tx.clone();
            act.up = Some(tx);
            act.agent.do_send(Input::Connected {
                session: act.session,
                lease,
                ttl_ms,
                revision,
                catalog,
            });
            // The writer sends in order; the reader runs on its own, so a
            // frame read is never cancelled half-way by another event.
            let write = async move {
                while let Some(message) = rx.recv().await {
                    writer.send(&message).await?;
                }
                Ok::<_, ClientError>(())
            };
            ctx.spawn(write.into_actor(act).map(|result, act, ctx| {
                if let Err(e) = result {
                    act.end(e.to_string(), ctx);
                }
            }));
            let read = read_session(reader, act.agent.clone(), act.session, tx_probe);
            ctx.spawn(
                read.into_actor(act)
                    .map(|reason, act, ctx| act.end(reason, ctx)),
            );
        }));
    }
}

/// Hands every message of the session stream to the agent, except the
/// arbiter's probes, answered here at once (R4: never queued behind the
/// agent's other work); returns why it ended.
async fn read_session(
    mut reader: SessionReader,
    agent: Recipient<Input>,
    session: SessionId,
    up: mpsc::UnboundedSender<SessionUp>,
) -> String {
    loop {
        match reader.next().await {
            Ok(SessionDown::Probe { nonce }) => {
                let _ = up.send(SessionUp::Alive { nonce });
            }
            Ok(message) => agent.do_send(Input::Message { session, message }),
            Err(e) => return e.to_string(),
        }
    }
}

impl SessionActor {
    /// The session ended: tell the agent once, close, stop.
    fn end(&mut self, reason: String, ctx: &mut Context<Self>) {
        if !self.ended {
            self.ended = true;
            self.agent.do_send(Input::SessionEnded {
                session: self.session,
                reason,
            });
        }
        if let Some(conn) = &self.conn {
            conn.close("session over");
        }
        ctx.stop();
    }
}

impl Handler<SendUp> for SessionActor {
    type Result = ();

    fn handle(&mut self, SendUp(message): SendUp, ctx: &mut Context<Self>) {
        if let Some(up) = &self.up {
            if up.send(message).is_ok() {
                self.watch(ctx);
            }
        }
    }
}

impl Handler<Ask> for SessionActor {
    type Result = ();

    fn handle(&mut self, Ask { request, body }: Ask, ctx: &mut Context<Self>) {
        let agent = self.agent.clone();
        let Some(conn) = self.conn.clone() else {
            return agent.do_send(Input::Answer {
                request,
                result: Err("the session is not up".into()),
            });
        };
        self.watch(ctx);
        tokio::spawn(async move {
            let result = conn.request(&body).await.map_err(|e| e.to_string());
            agent.do_send(Input::Answer { request, result });
        });
    }
}

impl Handler<CloseSession> for SessionActor {
    type Result = ();

    fn handle(&mut self, CloseSession(reason): CloseSession, ctx: &mut Context<Self>) {
        // Asked by the agent: it knows already.
        self.ended = true;
        if let Some(conn) = &self.conn {
            conn.close(&reason);
        }
        ctx.stop();
    }
}

/// A driver's hold on its one session actor: which of the machine's
/// sessions it carries, and where its messages go. The agent's actor and
/// the fleet bench's agents carry the machine's session outputs through
/// it.
#[derive(Default)]
pub struct SessionSlot(Option<(SessionId, Addr<SessionActor>)>);

impl SessionSlot {
    /// `Output::Connect`: starts the actor of `session` (in the calling
    /// actor's system), replacing any other.
    pub fn open(&mut self, session: SessionId, actor: SessionActor) {
        self.0 = Some((session, actor.start()));
    }

    /// `Output::Close`: closes `session` if it is the one held.
    pub fn close(&mut self, session: SessionId, reason: String) {
        if let Some((_, addr)) = self.0.take_if(|(s, _)| *s == session) {
            addr.do_send(CloseSession(reason));
        }
    }

    /// `Output::Send`; false when `session` is not the one held (it
    /// ended: the message has nowhere to go).
    pub fn send(&self, session: SessionId, message: SessionUp) -> bool {
        match &self.0 {
            Some((s, addr)) if *s == session => {
                addr.do_send(SendUp(message));
                true
            }
            _ => false,
        }
    }

    /// `Output::Request`; false when `session` is not the one held: the
    /// driver answers the request as lost.
    pub fn ask(&self, session: SessionId, request: u64, body: Request) -> bool {
        match &self.0 {
            Some((s, addr)) if *s == session => {
                addr.do_send(Ask { request, body });
                true
            }
            _ => false,
        }
    }

    /// Closes whatever session is held (a cut, a shutdown); which it was.
    pub fn close_any(&mut self, reason: String) -> Option<SessionId> {
        let (session, addr) = self.0.take()?;
        addr.do_send(CloseSession(reason));
        Some(session)
    }

    /// `session` ended on its own: forget it if it is the one held.
    pub fn ended(&mut self, session: SessionId) {
        self.0.take_if(|(s, _)| *s == session);
    }
}
