//! The Lua scripts (one per operation, each with the shared helpers it uses: `common.lua`,
//! `holds.lua`, `handoff.lua`, first or at its `-- @helpers` line),
//! their calls (`EVALSHA`, loaded again after `NOSCRIPT`) and the decoding of their answers.

use super::Shared;
use crate::error::{Error, Result};
use ::redis::{Cmd, ErrorKind, RedisWrite, Script, ToRedisArgs, Value};
use std::fmt;
use std::io::Write as _;

const COMMON: &str = include_str!("common.lua");
const HOLDS: &str = include_str!("holds.lua");
const HANDOFF: &str = include_str!("handoff.lua");
/// The line of a script where its helpers go, if not first.
const HELPERS_HERE: &str = "-- @helpers\n";

/// A script and its code (for `SCRIPT LOAD` at connect).
pub(super) struct Lua {
    pub(super) script: Script,
    pub(super) code: String,
}

impl std::ops::Deref for Lua {
    type Target = Script;
    fn deref(&self) -> &Script {
        &self.script
    }
}

impl Lua {
    fn new(code: String) -> Lua {
        Lua {
            script: Script::new(&code),
            code,
        }
    }
}

/// The scripts, each with the shared helpers prepended.
pub(super) struct Scripts {
    pub(super) grab: Lua,
    pub(super) acquire: Lua,
    pub(super) release: Lua,
    pub(super) extend: Lua,
    pub(super) cancel: Lua,
    pub(super) force_release: Lua,
    pub(super) describe: Lua,
    pub(super) set_value: Lua,
}

impl Scripts {
    /// The scripts; `sharded` (a cluster): release messages go out with `SPUBLISH`, to the
    /// subscribers of the lock's own shard, instead of `PUBLISH` (broadcast to every node).
    pub(super) fn new(sharded: bool) -> Scripts {
        // Each script gets the helpers it uses only: a helper defined in a script costs every
        // call of it (the chunk runs whole each time). A script whose common case needs none
        // has them at its `-- @helpers` line, after that case has returned.
        let with = |parts: &[&str], body: &str| {
            let helpers = parts.join("\n");
            let code = match body.split_once(HELPERS_HERE) {
                Some((fast, rest)) => format!("{fast}{helpers}\n{rest}"),
                None => format!("{helpers}\n{body}"),
            };
            Lua::new(if sharded {
                code.replace("redis.call('PUBLISH'", "redis.call('SPUBLISH'")
            } else {
                code
            })
        };
        Scripts {
            grab: with(&[], include_str!("grab.lua")),
            acquire: with(&[COMMON, HOLDS], include_str!("acquire.lua")),
            release: with(&[COMMON, HOLDS, HANDOFF], include_str!("release.lua")),
            extend: with(&[COMMON, HOLDS], include_str!("extend.lua")),
            cancel: with(&[COMMON, HOLDS, HANDOFF], include_str!("cancel.lua")),
            force_release: with(&[COMMON, HOLDS], include_str!("force_release.lua")),
            describe: with(&[COMMON, HOLDS], include_str!("describe.lua")),
            set_value: with(&[COMMON, HOLDS], include_str!("set_value.lua")),
        }
    }

    pub(super) fn all(&self) -> [&Lua; 8] {
        [
            &self.grab,
            &self.acquire,
            &self.release,
            &self.extend,
            &self.cancel,
            &self.force_release,
            &self.describe,
            &self.set_value,
        ]
    }
}

/// One `EVALSHA` of a script: its keys and arguments are written straight into one command
/// buffer, a key or argument of several parts (a base key and its suffix) included. redis-rs's
/// `ScriptInvocation` keeps each in an allocation of its own and copies them into a new command
/// for every call; on the path of every grant and release that was a third of the client's
/// allocations.
pub(super) struct Call<'a> {
    script: &'a Script,
    cmd: Cmd,
}

impl<'a> Call<'a> {
    /// A call of `script` whose first `keys` arguments are its keys.
    pub(super) fn new(script: &'a Script, keys: usize) -> Call<'a> {
        // Room for the scripts' arguments (at most 14) and a typical call's bytes; more grows.
        let mut cmd = Cmd::with_capacity(3 + keys + 14, 512);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        Call { script, cmd }
    }

    /// The next key or argument: `a` (a string, or a number written without an allocation).
    pub(super) fn arg(mut self, a: impl ToRedisArgs) -> Self {
        self.cmd.arg(a);
        self
    }

    /// The next keys or arguments: `base` followed by each of `suffixes` (`""`: `base` itself).
    pub(super) fn suffixed(mut self, base: &str, suffixes: &[&str]) -> Self {
        for s in suffixes {
            self = self.joined([base, s]);
        }
        self
    }

    /// The next key or argument, made of `parts` joined.
    pub(super) fn joined<S: AsRef<str>>(mut self, parts: impl IntoIterator<Item = S>) -> Self {
        let mut w = self.cmd.writer_for_next_arg();
        for p in parts {
            // A write into the command's `Vec` cannot fail.
            let _ = w.write_all(p.as_ref().as_bytes());
        }
        drop(w);
        self
    }
}

impl Shared {
    /// Runs `call` (loading its script after `NOSCRIPT`).
    pub(super) async fn run(&self, call: Call<'_>) -> Result<Value> {
        let mut conn = self.conn.clone();
        let run = async {
            match call.cmd.query_async::<Value>(&mut conn).await {
                Err(e) if e.kind() == ErrorKind::NoScriptError => {
                    call.script.prepare_invoke().load_async(&mut conn).await?;
                    call.cmd.query_async::<Value>(&mut conn).await
                }
                other => other,
            }
        };
        run.await.map_err(|e| self.err(e))
    }

    /// Runs the write `call`; with `replicas=N` followed by `WAIT`, answering how many
    /// replicas confirmed it.
    pub(super) async fn write(&self, call: Call<'_>) -> Result<(Value, Option<u32>)> {
        if self.target.replicas == 0 {
            return Ok((self.run(call).await?, None));
        }
        let (mut out, confirmed) = self.run_cmds(call.script, vec![call.cmd], true).await?;
        let v = out.pop().ok_or_else(|| unexpected("answer count", &0))?;
        Ok((v, confirmed))
    }

    /// Runs a pipeline of `EVALSHA`s of `script`, loading the script and retrying once after
    /// `NOSCRIPT` (the scripts are idempotent for a repeat).
    pub(super) async fn eval_pipeline(
        &self,
        script: &Script,
        calls: &[(Vec<String>, Vec<String>)],
    ) -> Result<Vec<Value>> {
        Ok(self.run_pipeline(script, calls, false).await?.0)
    }

    /// Like [`Shared::eval_pipeline`], for writes: with `replicas=N` the pipeline ends with
    /// `WAIT N replicas_timeout` (on the same connection, so it covers these writes), and the
    /// answer says how many replicas confirmed them (`None` without `replicas`).
    pub(super) async fn eval_confirmed(
        &self,
        script: &Script,
        calls: &[(Vec<String>, Vec<String>)],
    ) -> Result<(Vec<Value>, Option<u32>)> {
        self.run_pipeline(script, calls, self.target.replicas > 0)
            .await
    }

    /// One pipeline per slot on a cluster (a pipeline must not span slots), sent at once; one
    /// pipeline elsewhere. The answers are in the order of `calls`; the replicas that confirmed
    /// are the fewest any pipeline's `WAIT` counted.
    async fn run_pipeline(
        &self,
        script: &Script,
        calls: &[(Vec<String>, Vec<String>)],
        wait: bool,
    ) -> Result<(Vec<Value>, Option<u32>)> {
        if !self.sharded || calls.len() < 2 {
            return self.run_one_pipeline(script, calls, wait).await;
        }
        // Calls whose first key has the same hash tag are in the same slot.
        let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
        for (i, (keys, _)) in calls.iter().enumerate() {
            let tag = keys.first().map_or("", |k| hash_tag(k));
            match groups.iter_mut().find(|(t, _)| *t == tag) {
                Some((_, idx)) => idx.push(i),
                None => groups.push((tag, vec![i])),
            }
        }
        if groups.len() == 1 {
            return self.run_one_pipeline(script, calls, wait).await;
        }
        let runs = groups.iter().map(|(_, idx)| {
            let part: Vec<(Vec<String>, Vec<String>)> =
                idx.iter().map(|i| calls[*i].clone()).collect();
            async move { self.run_one_pipeline(script, &part, wait).await }
        });
        let answers = futures_util::future::join_all(runs).await;
        let mut out: Vec<Option<Value>> = vec![None; calls.len()];
        let mut confirmed: Option<u32> = None;
        for ((_, idx), answer) in groups.iter().zip(answers) {
            let (values, n) = answer?;
            if let Some(n) = n {
                confirmed = Some(confirmed.map_or(n, |c| c.min(n)));
            }
            for (i, v) in idx.iter().zip(values) {
                out[*i] = Some(v);
            }
        }
        let out: Option<Vec<Value>> = out.into_iter().collect();
        let out = out.ok_or_else(|| unexpected("pipeline answer count", &calls.len()))?;
        Ok((out, confirmed))
    }

    async fn run_one_pipeline(
        &self,
        script: &Script,
        calls: &[(Vec<String>, Vec<String>)],
        wait: bool,
    ) -> Result<(Vec<Value>, Option<u32>)> {
        let cmds = calls
            .iter()
            .map(|(keys, args)| Call::new(script, keys.len()).arg(keys).arg(args).cmd)
            .collect();
        self.run_cmds(script, cmds, wait).await
    }

    /// Runs `cmds` (`EVALSHA`s of `script`) in one pipeline, loading the script and retrying
    /// once after `NOSCRIPT` (the scripts are idempotent for a repeat); with `wait`, the
    /// pipeline ends with `WAIT` and the answer says how many replicas confirmed the writes.
    async fn run_cmds(
        &self,
        script: &Script,
        cmds: Vec<Cmd>,
        wait: bool,
    ) -> Result<(Vec<Value>, Option<u32>)> {
        let n = cmds.len();
        let mut pipe = ::redis::pipe();
        for c in cmds {
            pipe.add_command(c);
        }
        if wait {
            // A cluster pipeline goes to the node of its first keyed command: the keys' master.
            pipe.cmd("WAIT")
                .arg(self.target.replicas)
                .arg(u64::try_from(self.target.replicas_timeout.as_millis()).unwrap_or(u64::MAX));
        }
        let mut conn = self.conn.clone();
        let run = async {
            match pipe.query_async::<Vec<Value>>(&mut conn).await {
                Err(e) if e.kind() == ErrorKind::NoScriptError => {
                    script.prepare_invoke().load_async(&mut conn).await?;
                    pipe.query_async::<Vec<Value>>(&mut conn).await
                }
                other => other,
            }
        };
        let mut out = run.await.map_err(|e| self.err(e))?;
        let confirmed = if wait {
            let v = out.pop();
            let n = v.as_ref().and_then(int).and_then(|n| u32::try_from(n).ok());
            Some(n.ok_or_else(|| unexpected("WAIT answer", &v))?)
        } else {
            None
        };
        if out.len() != n {
            return Err(unexpected("pipeline answer count", &out.len()));
        }
        Ok((out, confirmed))
    }
}

/// The part of `key` Redis Cluster hashes: between the first `{` and the next `}` if that is not
/// empty, else the whole key.
fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(len) = key[open + 1..].find('}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// The longest part of an unexpected answer an error quotes.
const QUOTE_MAX: usize = 512;

/// The error of an answer dlock's scripts never give: it quotes the answer, cut to
/// [`QUOTE_MAX`] bytes (a foreign key can hold a large value).
pub(super) fn unexpected(what: &str, v: &dyn fmt::Debug) -> Error {
    let mut quoted = format!("{v:?}");
    if quoted.len() > QUOTE_MAX {
        let mut end = QUOTE_MAX;
        while !quoted.is_char_boundary(end) {
            end -= 1;
        }
        quoted.truncate(end);
        quoted.push('…');
    }
    Error::backend(format!("unexpected {what} from redis: {quoted}"))
}

pub(super) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

pub(super) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::Nil => Some(String::new()),
        _ => None,
    }
}

#[cfg(test)]
#[test]
fn hash_tags_as_redis_cluster_reads_them() {
    assert_eq!(hash_tag("dlock:{jobs}:fence"), "jobs");
    assert_eq!(hash_tag("dlock:{a}b}"), "a");
    assert_eq!(hash_tag("dlock:{}x}"), "dlock:{}x}");
    assert_eq!(hash_tag("dlock:{\0}x}"), "\0");
    assert_eq!(hash_tag("plain"), "plain");
    assert_eq!(hash_tag("open{only"), "open{only");
}

pub(super) fn array(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(a) => Some(a),
        _ => None,
    }
}
