//! The Lua scripts (one per operation, each with the shared helpers of `common.lua` prepended),
//! their calls (`EVALSHA`, loaded again after `NOSCRIPT`) and the decoding of their answers.

use super::Shared;
use crate::error::{Error, Result};
use ::redis::{Cmd, ErrorKind, Script, Value};
use std::fmt;

const COMMON: &str = include_str!("common.lua");

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
    pub(super) acquire: Lua,
    pub(super) release: Lua,
    pub(super) extend: Lua,
    pub(super) cancel: Lua,
    pub(super) force_release: Lua,
    pub(super) describe: Lua,
}

impl Scripts {
    pub(super) fn new() -> Scripts {
        let with = |body: &str| Lua::new(format!("{COMMON}\n{body}"));
        Scripts {
            acquire: with(include_str!("acquire.lua")),
            release: with(include_str!("release.lua")),
            extend: with(include_str!("extend.lua")),
            cancel: with(include_str!("cancel.lua")),
            force_release: with(include_str!("force_release.lua")),
            describe: with(include_str!("describe.lua")),
        }
    }

    pub(super) fn all(&self) -> [&Lua; 6] {
        [
            &self.acquire,
            &self.release,
            &self.extend,
            &self.cancel,
            &self.force_release,
            &self.describe,
        ]
    }
}

impl Shared {
    /// `EVALSHA` of `script` (loading it after `NOSCRIPT`).
    pub(super) async fn eval(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[String],
    ) -> Result<Value> {
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(*k);
        }
        for a in args {
            inv.arg(a.as_str());
        }
        let mut conn = self.conn.clone();
        inv.invoke_async::<Value>(&mut conn)
            .await
            .map_err(|e| self.err(e))
    }

    /// Runs a pipeline of `EVALSHA`s of `script`, loading the script and retrying once after
    /// `NOSCRIPT` (the scripts are idempotent for a repeat).
    pub(super) async fn eval_pipeline(
        &self,
        script: &Script,
        calls: &[(Vec<String>, Vec<String>)],
    ) -> Result<Vec<Value>> {
        let mut pipe = ::redis::pipe();
        for (keys, args) in calls {
            let mut c = Cmd::new();
            c.arg("EVALSHA")
                .arg(script.get_hash())
                .arg(keys.len())
                .arg(keys)
                .arg(args);
            pipe.add_command(c);
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
        let out = run.await.map_err(|e| self.err(e))?;
        if out.len() != calls.len() {
            return Err(unexpected("pipeline answer count", &out.len()));
        }
        Ok(out)
    }
}

pub(super) fn unexpected(what: &str, v: &dyn fmt::Debug) -> Error {
    Error::backend(format!("unexpected {what} from redis: {v:?}"))
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

pub(super) fn array(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(a) => Some(a),
        _ => None,
    }
}
