//! The fenced resource: a counter on loopback TCP that client processes read and write while they
//! hold the lock, and that records every write with its fencing token and the writer's claimed
//! hold interval.
//!
//! Protocol: one JSON object per line. `{"op":"read","worker":W,"hold":H,"token":T|null}` →
//! `{"value":N}`;
//! `{"op":"write","worker":W,"hold":H,"token":T|null,"claimed_from":US,"read":N,"value":M}` →
//! `{"accepted":bool,"highest":T|null}`.
//!
//! Every operation presents the holder's token, reads included: a read-modify-write is fenced
//! from its read on, so once a newer holder has read, an older holder's late write is refused
//! (fencing only writes would accept it when it lands between the newer holder's read and its
//! write, and the newer holder's write would then overwrite it: a lost update).
//!
//! In [`Mode::Enforcing`] a write is refused when its token is lower than the highest seen, or
//! equal to it but from another hold (two holds with one token: the store's fence went back). A
//! write without a token (a store without fencing) cannot be checked and is accepted. In
//! [`Mode::LogOnly`] every write is accepted; the analysis finds the violations afterwards.

use crate::event::{now_us, ReadRecord, WriteRecord};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// How the resource treats a stale token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Refuse a write whose token is lower than the highest seen.
    Enforcing,
    /// Accept every write; violations are only recorded.
    LogOnly,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Enforcing => "enforcing",
            Mode::LogOnly => "log-only",
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Request {
    Read {
        worker: u32,
        hold: u64,
        token: Option<u64>,
    },
    Write(Write),
}

/// One write: who writes (worker index and hold number), with which token, since when it claims
/// to hold the lock, the value it read and the value it writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Write {
    pub worker: u32,
    pub hold: u64,
    pub token: Option<u64>,
    pub claimed_from: i64,
    pub read: u64,
    pub value: u64,
}

#[derive(Default)]
struct State {
    value: u64,
    /// The highest token seen and the hold that presented it.
    highest: Option<(u64, u32, u64)>,
    writes: Vec<WriteRecord>,
    reads: Vec<ReadRecord>,
}

impl State {
    /// Registers a presented token: the highest one seen and the hold that presented it.
    fn see(&mut self, token: Option<u64>, worker: u32, hold: u64) {
        if let Some(t) = token {
            if self.highest.map_or(true, |(h, _, _)| t > h) {
                self.highest = Some((t, worker, hold));
            }
        }
    }
}

/// A running resource; stops when dropped.
pub struct Resource {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Resource {
    /// Listens on a free loopback port.
    pub async fn start(mode: Mode) -> std::io::Result<Resource> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let st = st.clone();
                tokio::spawn(async move {
                    let _ = serve(sock, st, mode).await;
                });
            }
        });
        Ok(Resource { addr, state, task })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The counter's value, every write and every read so far.
    pub fn snapshot(&self) -> (u64, Vec<WriteRecord>, Vec<ReadRecord>) {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        (st.value, st.writes.clone(), st.reads.clone())
    }
}

impl Drop for Resource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(sock: TcpStream, state: Arc<Mutex<State>>, mode: Mode) -> std::io::Result<()> {
    sock.set_nodelay(true)?;
    let (rd, mut wr) = sock.into_split();
    let mut lines = BufReader::new(rd).lines();
    while let Some(line) = lines.next_line().await? {
        let answer = match serde_json::from_str::<Request>(&line) {
            Err(e) => serde_json::json!({ "error": e.to_string() }),
            Ok(Request::Read {
                worker,
                hold,
                token,
            }) => {
                let at = now_us();
                let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
                st.see(token, worker, hold);
                st.reads.push(ReadRecord {
                    worker,
                    hold,
                    token,
                    at,
                });
                serde_json::json!({ "value": st.value })
            }
            Ok(Request::Write(w)) => {
                let (worker, hold, token, value) = (w.worker, w.hold, w.token, w.value);
                let at = now_us();
                let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
                let stale = match (token, st.highest) {
                    (Some(t), Some((h, w, k))) => t < h || (t == h && (w, k) != (worker, hold)),
                    _ => false,
                };
                let accepted = mode == Mode::LogOnly || !stale;
                st.see(token, worker, hold);
                if accepted {
                    st.value = value;
                }
                st.writes.push(WriteRecord {
                    worker,
                    hold,
                    token,
                    claimed_from: w.claimed_from,
                    at,
                    read: w.read,
                    value,
                    accepted,
                });
                serde_json::json!({ "accepted": accepted, "highest": st.highest.map(|h| h.0) })
            }
        };
        let mut out = answer.to_string();
        out.push('\n');
        wr.write_all(out.as_bytes()).await?;
    }
    Ok(())
}

/// A client process's connection to the resource.
pub struct ResourceClient {
    lines: tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    wr: tokio::net::tcp::OwnedWriteHalf,
}

impl ResourceClient {
    /// Connects to the resource at `addr`.
    pub async fn connect(addr: SocketAddr) -> std::io::Result<ResourceClient> {
        let sock = TcpStream::connect(addr).await?;
        sock.set_nodelay(true)?;
        let (rd, wr) = sock.into_split();
        Ok(ResourceClient {
            lines: BufReader::new(rd).lines(),
            wr,
        })
    }

    async fn call(&mut self, req: serde_json::Value) -> std::io::Result<serde_json::Value> {
        let mut out = req.to_string();
        out.push('\n');
        self.wr.write_all(out.as_bytes()).await?;
        let line = self.lines.next_line().await?.ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "resource closed")
        })?;
        serde_json::from_str(&line).map_err(std::io::Error::other)
    }

    /// Reads the counter, presenting the reader's hold and token.
    pub async fn read(
        &mut self,
        worker: u32,
        hold: u64,
        token: Option<u64>,
    ) -> std::io::Result<u64> {
        let v = self
            .call(
                serde_json::json!({ "op": "read", "worker": worker, "hold": hold, "token": token }),
            )
            .await?;
        v["value"]
            .as_u64()
            .ok_or_else(|| std::io::Error::other(format!("bad answer {v}")))
    }

    /// Writes the counter; whether the resource accepted it.
    pub async fn write(&mut self, w: &Write) -> std::io::Result<bool> {
        let mut req = serde_json::to_value(w).map_err(std::io::Error::other)?;
        req["op"] = "write".into();
        let v = self.call(req).await?;
        v["accepted"]
            .as_bool()
            .ok_or_else(|| std::io::Error::other(format!("bad answer {v}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(
        worker: u32,
        hold: u64,
        token: Option<u64>,
        claimed_from: i64,
        read: u64,
        value: u64,
    ) -> Write {
        Write {
            worker,
            hold,
            token,
            claimed_from,
            read,
            value,
        }
    }

    #[tokio::test]
    async fn enforcing_refuses_lower_and_foreign_equal_tokens() {
        let r = Resource::start(Mode::Enforcing).await.unwrap();
        let mut c = ResourceClient::connect(r.addr()).await.unwrap();
        assert_eq!(c.read(1, 1, Some(5)).await.unwrap(), 0);
        assert!(c.write(&w(1, 1, Some(5), 0, 0, 1)).await.unwrap());
        assert!(
            c.write(&w(1, 1, Some(5), 0, 1, 2)).await.unwrap(),
            "same hold again"
        );
        assert!(
            !c.write(&w(2, 1, Some(4), 0, 2, 3)).await.unwrap(),
            "lower token"
        );
        assert!(
            !c.write(&w(3, 1, Some(5), 0, 2, 3)).await.unwrap(),
            "equal, other hold"
        );
        assert!(c.write(&w(3, 2, Some(6), 0, 2, 3)).await.unwrap());
        assert!(
            c.write(&w(4, 1, None, 0, 3, 4)).await.unwrap(),
            "no token: unchecked"
        );
        let (value, writes, reads) = r.snapshot();
        assert_eq!(value, 4);
        assert_eq!(writes.iter().filter(|w| !w.accepted).count(), 2);
        assert_eq!(reads.len(), 1);
        // A newer holder's read fences off an older holder's write.
        assert_eq!(c.read(5, 1, Some(9)).await.unwrap(), 4);
        assert!(!c.write(&w(6, 1, Some(8), 0, 4, 5)).await.unwrap());
    }

    #[tokio::test]
    async fn log_only_accepts_everything_and_records_it() {
        let r = Resource::start(Mode::LogOnly).await.unwrap();
        let mut c = ResourceClient::connect(r.addr()).await.unwrap();
        assert!(c.write(&w(1, 1, Some(5), 0, 0, 1)).await.unwrap());
        assert!(c.write(&w(2, 1, Some(4), 0, 0, 1)).await.unwrap());
        let (value, writes, _) = r.snapshot();
        assert_eq!(value, 1);
        assert_eq!(writes.len(), 2);
        assert!(writes.iter().all(|w| w.accepted));
    }
}
