//! The server-side routines of lease mode, created by the migration when missing.
//!
//! **The grant routine** (`<table>_grant_v4` on PostgreSQL, `<table>_grant_v1` on
//! MySQL/MariaDB) answers the two common cases of an exclusive `acquire` that takes no queue
//! place inside the server in one round trip — a name with no rows at all (grant) and live holds
//! of other owners (refuse) — and says "take the full path" for everything else. The backend
//! calls it for no other requests (`p_busy_ok` stays in the signature: the routine may refuse).
//! The full path (a transaction around `decide`) stays the specification; the routine only ever
//! answers what `decide` would answer. Both run at `READ COMMITTED` (PostgreSQL's default; dlock
//! sets it on MySQL sessions): every statement takes a fresh snapshot.
//!
//! - PostgreSQL: a PL/pgSQL function called with `SELECT` on an autocommitted connection. It
//!   looks at the name's holds, queue and fence in one statement, without any lock; a refusal
//!   or a "full path" answer writes nothing. A name that looked empty is granted by a
//!   compare-and-set of its fence row (`UPDATE … SET fence = fence + 1 WHERE fence = <the fence
//!   it saw>`, or the row's first insert): every transaction that makes a hold live (this one,
//!   the full path, a release's hand-off, session mode) takes the next fence under that row's
//!   lock, so an unchanged fence proves that no hold was granted since the look, and an update
//!   that waited for a grant in progress sees its new fence and changes nothing. A lost race has
//!   written nothing (no transaction id, so no commit flush) and looks again for its answer. A
//!   refused waiting mutex request registers in `<table>_waiters` (a row per waiter: its
//!   client's hand-off channel and listener lock, its lease and metadata) for a hand-off. The
//!   earlier `_grant_v2` (a procedure that looked, locked the row, looked again and ended its
//!   own transaction) ran more statements for the same answer; it stays for older clients.
//! - MySQL/MariaDB: a procedure called with `CALL` that ends its own transaction (`COMMIT`
//!   after a grant, `ROLLBACK` otherwise); its answer is its result set. Each statement of a
//!   procedure costs more there and a lost race rolls back for free, so it locks the fence row
//!   first and looks once, under the lock.
//!
//! **The release function** (PostgreSQL only, `<table>_release_v5`): deletes the owner's hold
//! and, when a registered mutex waiter of a live client is waiting and nothing else stands in
//! the way (no other live hold), grants that waiter the lock in the same transaction (a new
//! fence token, its lease and metadata from its registration) and tells its client alone
//! (`NOTIFY` on the client's hand-off channel, payload `"token owner name"`). Without a fair
//! queue that is the earliest registered waiter; with one, only the queue's head (its first
//! live place, an exclusive one), whose place the hold replaces: fair mutex waiters register
//! too. Otherwise it sends the name's `NOTIFY` only when somebody waits (a registration or a
//! queue place). It looks for waiters under the name's wake lock (`WAKE_KEY`); a grant routine call
//! that registers its waiter takes that lock shared and looks again before it registers. A
//! client is live while its listener connection holds the session advisory lock
//! `(lk1, lk2)` its registrations name: the server frees it when the connection ends. A release
//! that hands nothing on (nobody waits) commits with `synchronous_commit = off` for its own
//! transaction: it writes no fence, and if a server crash loses it the hold comes back and ends
//! with its lease (the waiters wait that long), never a second holder; a later synced commit
//! (any grant's) flushes it with its own. A release that hands the lock on writes the next fence
//! and stays synced. `_release_v4` did the same but woke a fair queue's waiters rather than
//! hand the lock to its head, and `_release_v3` also synced every release; they stay for older
//! clients.
//!
//! Every routine sets `enable_bitmapscan = off` for its transaction: a bitmap scan never marks
//! index entries of dead rows, so on a table that autovacuum does not clean (it is off, or has
//! not come round yet) every look of a hot name would read every hold that name ever had; a
//! plain index scan marks them and the index deletes them (docs/BENCHMARKS.md, issue 20).
//!
//! **The ring routines** (MySQL/MariaDB only, `<table>_ring_v2` and `<table>_unring_v1`; see
//! `ring_call_sql`, `unring_call_sql` and `bell.rs`): a non-fair mutex waiter waits for its
//! name's bell in the first and takes the hold that the bell's last holder reserved; that
//! holder's release is the second, on the bell's session. A waiter of a name its client saw
//! busy lately attempts in the ring routine too, so a refusal and the wait that follows are one
//! call. Without them (an account that may not
//! create them) non-fair waiters poll, as before they existed.
//!
//! The routines are created by the migration (under the migration lock) when missing; when they
//! cannot be created (no privilege) or are dropped later, the backend logs it once and uses the
//! full path only, and releases wake every waiter as before.

use super::config::Dialect;

/// The grant routine's name for table `t` (versioned: a changed routine gets a new name, so
/// clients of different dlock versions can share a table).
pub fn routine(d: Dialect, t: &str) -> String {
    match d {
        Dialect::Postgres => format!("{t}_grant_v4"),
        Dialect::MySql => format!("{t}_grant_v1"),
    }
}

/// The ring routine's name (MySQL/MariaDB, `<table>_ring_v2`): a non-fair mutex waiter
/// attempts in it and, refused, waits for its name's bell and takes the hold its release
/// reserved (see `ring_call_sql`). `_ring_v1` did not attempt first.
pub fn ring_routine(t: &str) -> String {
    format!("{t}_ring_v2")
}

/// The bell holder's release routine (MySQL/MariaDB, `<table>_unring_v1`; see
/// `unring_call_sql`).
pub fn unring_routine(t: &str) -> String {
    format!("{t}_unring_v1")
}

/// How long a hold reserved for the bell's next holder stays reserved if nobody takes it (the
/// taker is already in the server, woken by the bell; the bound only covers a taker whose
/// connection ended in between).
pub(super) const RESERVE_MS: i64 = 500;

/// The release function's name (PostgreSQL).
pub fn release_routine(t: &str) -> String {
    format!("{t}_release_v5")
}

/// The table of waiters registered for hand-offs and wake-ups (PostgreSQL).
pub fn waiters(t: &str) -> String {
    format!("{t}_waiters")
}

/// The key of a name's wake lock (PostgreSQL), a transaction-level advisory lock: a release
/// takes it exclusively before it looks for waiters, and every transaction that makes its
/// client a waiter of the name (a queue place, a registration) takes it shared before it looks
/// at the name's holds. So a waiter that a release's look missed is one whose own look comes
/// after that release's commit and finds the hold gone. `$1` is [`wake_key_text`].
pub(super) const WAKE_KEY: &str = "hashtextextended($1, 0)";

/// The text [`WAKE_KEY`] hashes for `name` of table `t`.
pub(super) fn wake_key_text(t: &str, name: &str) -> String {
    format!("{t}:{name}")
}

/// A `BEGIN` that also takes the name's wake lock shared (one round trip; a simple query, so
/// the key text is an escaped literal).
pub(super) fn begin_wake_sql(t: &str, name: &str) -> String {
    let text = wake_key_text(t, name)
        .replace('\\', "\\\\")
        .replace('\'', "\\'");
    format!("BEGIN; SELECT pg_advisory_xact_lock_shared(hashtextextended(E'{text}', 0))")
}

/// The hand-off channel of a client whose listener holds advisory lock `(lk1, lk2)`.
pub(super) fn handoff_channel(t: &str, lk1: i32, lk2: i32) -> String {
    format!("{t}_h{:08x}{:08x}", lk1 as u32, lk2 as u32)
}

/// `answer` of the routine: take the full path.
pub(super) const FULL: i64 = 0;
/// `answer` of the routine: granted with fencing token `token`.
pub(super) const GRANTED: i64 = 1;
/// `answer` of the routine: refused; the shortest live lease in the way ends in `wait_ms`.
pub(super) const BUSY: i64 = 2;
/// `rung` of the ring routine's first answer when it attempted first: the attempt's answer.
pub(super) const TRIED: i64 = 2;

/// The release function's answers.
pub(super) const NOT_HELD: i64 = 0;
/// Released; the waiters were woken if any.
pub(super) const RELEASED: i64 = 1;
/// Released and handed to a registered waiter.
pub(super) const HANDED_OFF: i64 = 2;

/// The routines of table `t` that the backend needs (their names).
fn routine_names(d: Dialect, t: &str) -> Vec<String> {
    match d {
        Dialect::Postgres => vec![routine(d, t), release_routine(t)],
        Dialect::MySql => vec![routine(d, t), ring_routine(t), unring_routine(t)],
    }
}

/// `SELECT {what}` over those of [`routine_names`] that exist.
fn routines_select(d: Dialect, t: &str, what: &str) -> String {
    let names = routine_names(d, t)
        .iter()
        .map(|r| format!("'{r}'"))
        .collect::<Vec<_>>()
        .join(", ");
    match d {
        Dialect::Postgres => format!(
            "SELECT {what} FROM pg_proc p \
             JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = current_schema() AND \
             p.prokind = 'f' AND p.proname IN ({names})"
        ),
        Dialect::MySql => format!(
            "SELECT {what} FROM information_schema.ROUTINES \
             WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME IN ({names}) \
             AND ROUTINE_TYPE = 'PROCEDURE'"
        ),
    }
}

/// The statement that says whether the routines exist (one row, one BIGINT: how many of them).
pub(super) fn exists_sql(d: Dialect, t: &str) -> String {
    routines_select(
        d,
        t,
        match d {
            Dialect::Postgres => "CAST(count(*) AS BIGINT)",
            Dialect::MySql => "CAST(COUNT(*) AS SIGNED)",
        },
    )
}

/// The statement that lists which of the routines exist (one row each: its name).
pub(super) fn existing_sql(d: Dialect, t: &str) -> String {
    routines_select(
        d,
        t,
        match d {
            Dialect::Postgres => "CAST(p.proname AS TEXT)",
            Dialect::MySql => "ROUTINE_NAME",
        },
    )
}

/// How many routines [`exists_sql`] counts when all are there.
pub(super) fn routine_count(d: Dialect) -> i64 {
    routine_names(d, "").len() as i64
}

/// The call. PostgreSQL binds `name, owner, kind, permits, mode, lease_ms, client_id, host,
/// pid, value, busy_ok, register, registered, channel, lk1, lk2` and answers one row `(answer,
/// token, wait_ms, seen)`; MySQL binds `name, owner, kind, permits, mode, lease_ms, client_id,
/// host, pid, busy_ok` and answers `(answer, token, wait_ms)`. All BIGINT.
pub(super) fn call_sql(d: Dialect, t: &str) -> String {
    let r = routine(d, t);
    match d {
        Dialect::Postgres => format!(
            "SELECT answer, token, wait_ms, seen \
             FROM {r}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)"
        ),
        Dialect::MySql => format!("CALL {r}(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
    }
}

/// The ring call (MySQL/MariaDB): binds `bell, secs, name, owner, lease_ms, client_id, host,
/// pid, value, try, kind, permits, mode` and answers rows `(rung, answer, token, wait_ms)`.
///
/// With `try`, it first attempts as the grant routine does (and writes `value` with the hold):
/// its first row has `rung` [`TRIED`] and the grant routine's answer. A grant or a [`FULL`]
/// answer ends the call; after a [`BUSY`] one the call asks for the bell, and the server sends
/// that first row at once, before the wait.
///
/// The bell's row: `rung` is `GET_LOCK`'s answer (1: the bell is this session's now; 0: not
/// within `secs`; -1: an error), and with the bell, `answer` [`GRANTED`] and `token` when it
/// took the hold that the bell's last holder reserved for it (the owner's hold now, with the
/// next fence and its lease from the take), [`BUSY`] when holders that did not reserve it are in
/// the way (the waiter polls with the bell), else [`FULL`] (the waiter attempts).
pub(super) fn ring_call_sql(t: &str) -> String {
    format!(
        "CALL {}(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        ring_routine(t)
    )
}

/// The release of a hold whose name has a bell (MySQL/MariaDB): binds `bell, name, owner,
/// reserve` and answers one row `(released, handed)`. It deletes the owner's hold; with
/// `reserve` (a non-fair mutex), when this session holds the bell and nobody queues for the
/// name, it turns the hold into the reservation for the bell's next holder instead (the same row
/// with an empty owner, `state` 3, its fence and a lease of [`RESERVE_MS`]; one autocommitted
/// statement). Then it frees the bell, if this session holds it. `handed`: for the bell's holder,
/// the reservation stands (somebody asked for the bell and takes it; a reservation nobody asked
/// for goes again at once); for a session without the bell, another session holds it (a waiter
/// that polls with it and takes the lock at its next look).
pub(super) fn unring_call_sql(t: &str) -> String {
    format!("CALL {}(?, ?, ?, ?)", unring_routine(t))
}

/// The release call (PostgreSQL): binds `name, owner, leaving` (a waiter that gives up: its
/// registration goes first, and a lock handed to it meanwhile is passed on).
pub(super) fn release_sql(t: &str) -> String {
    format!("SELECT {}($1, $2, $3)", release_routine(t))
}

/// Removes the routines and the waiters' table, if they exist: the statements to run in order
/// (PostgreSQL: one, for every version of the grant routine this dlock ever made, the release
/// function and `<table>_waiters`; MySQL/MariaDB: one `DROP PROCEDURE` per routine, and one for
/// `_ring_v1`).
pub fn drop_sql(d: Dialect, t: &str) -> Vec<String> {
    match d {
        Dialect::Postgres => vec![format!(
            "DO $dlock$ BEGIN \
             DROP ROUTINE IF EXISTS {t}_grant_v1, {t}_grant_v2, {t}_grant_v3, {t}_grant_v4, \
             {t}_release_v1, {t}_release_v2, {t}_release_v3, {t}_release_v4, {rel}; \
             DROP TABLE IF EXISTS {w}; \
             END $dlock$",
            rel = release_routine(t),
            w = waiters(t)
        )],
        Dialect::MySql => routine_names(d, t)
            .into_iter()
            .chain([format!("{t}_ring_v1")])
            .map(|r| format!("DROP PROCEDURE IF EXISTS {r}"))
            .collect(),
    }
}

/// The waiters' table (PostgreSQL), `UNLOGGED`: a registration is written without a WAL
/// record, so a refused attempt that registers commits without a disk flush; after a crash
/// the table is empty, as every waiter's connection is gone.
///
/// `handoff`: a mutex waiter the release may hand the lock to (else it is only woken: readers,
/// permits, an election's observers); `channel`, `lk1`, `lk2`: its client's hand-off channel
/// and the advisory lock that client's listener holds; `lease_ms` and the metadata: the hold a
/// hand-off writes; `arrived`: the order of hand-offs (microseconds on the database clock).
pub(super) fn waiters_sql(t: &str) -> String {
    let w = waiters(t);
    format!(
        "CREATE UNLOGGED TABLE IF NOT EXISTS {w} (
            name TEXT NOT NULL,
            owner TEXT NOT NULL,
            handoff BOOLEAN NOT NULL,
            channel TEXT NOT NULL,
            lk1 INTEGER NOT NULL,
            lk2 INTEGER NOT NULL,
            lease_ms BIGINT NOT NULL,
            client_id TEXT NOT NULL,
            host TEXT NOT NULL,
            pid BIGINT NOT NULL,
            value TEXT,
            arrived BIGINT NOT NULL,
            CONSTRAINT {w}_name_owner PRIMARY KEY (name, owner))"
    )
}

/// A registration, inserted or brought up to date (an arrival keeps its place). Binds `name,
/// owner, handoff, channel, lk1, lk2, lease_ms, client_id, host, pid, value` (`$1`…`$11`), as
/// the grant routine's parameters do.
pub(super) fn register_sql(t: &str, args: [&str; 11]) -> String {
    let w = waiters(t);
    let [name, owner, handoff, channel, lk1, lk2, lease, client, host, pid, value] = args;
    format!(
        "INSERT INTO {w} AS w (name, owner, handoff, channel, lk1, lk2, lease_ms, client_id, host,
                               pid, value, arrived)
             VALUES ({name}, {owner}, {handoff}, {channel}, {lk1}, {lk2}, {lease}, {client},
                     {host}, {pid}, {value},
                     floor(extract(epoch from clock_timestamp()) * 1000000)::bigint)
             ON CONFLICT (name, owner) DO UPDATE
                 SET handoff = excluded.handoff, channel = excluded.channel, lk1 = excluded.lk1,
                     lk2 = excluded.lk2
                 WHERE (w.handoff, w.channel, w.lk1, w.lk2)
                     IS DISTINCT FROM (excluded.handoff, excluded.channel, excluded.lk1,
                                       excluded.lk2)"
    )
}

/// `CREATE` statements of the routines (and on PostgreSQL the waiters' table first), each with
/// the routine it creates (`None`: always run; PostgreSQL's are idempotent). All run with the
/// caller's privileges (`SECURITY INVOKER`). `now` is the dialect's millisecond clock expression;
/// `collation` the MySQL key collation (unused on PostgreSQL).
pub(super) fn create_sql(
    d: Dialect,
    t: &str,
    now: &str,
    collation: &str,
) -> Vec<(Option<String>, String)> {
    match d {
        Dialect::Postgres => vec![
            (None, waiters_sql(t)),
            (None, pg_grant(t, now)),
            (None, pg_release(t, now)),
        ],
        Dialect::MySql => vec![
            (Some(routine(d, t)), mysql_grant(t, now, collation)),
            (Some(ring_routine(t)), mysql_ring(t, now, collation)),
            (Some(unring_routine(t)), mysql_unring(t, now, collation)),
        ],
    }
}

/// Plans of the routine's statements: plain index scans (see the module docs).
const INDEX_SCANS: &str = "PERFORM set_config('enable_bitmapscan', 'off', true);";

fn pg_grant(t: &str, now: &str) -> String {
    let r = routine(Dialect::Postgres, t);
    // What the name's rows say at v_now, in one snapshot: live hold count, whether a live one is
    // the requester's or of another kind (then `decide` must judge), the earliest live expiry,
    // the highest live token, the expired count, whether a queue place exists, and the name's
    // fence (NULL: the name never had one).
    let look = format!(
        "SELECT count(*) FILTER (WHERE expires_at_ms > v_now),
                coalesce(bool_or(expires_at_ms > v_now AND (owner = p_owner
                    OR kind <> p_kind OR permits <> p_permits)), false),
                min(expires_at_ms) FILTER (WHERE expires_at_ms > v_now),
                max(fence) FILTER (WHERE expires_at_ms > v_now),
                count(*) FILTER (WHERE expires_at_ms <= v_now),
                EXISTS (SELECT 1 FROM {t}_queue WHERE name = p_name),
                (SELECT fence FROM {t}_fences WHERE name = p_name)
           INTO v_live, v_odd, v_min, v_top, v_dead, v_queued, v_fence
           FROM {t} WHERE name = p_name;"
    );
    let register = format!(
        "IF p_register THEN
            {};
        END IF;",
        register_sql(
            t,
            [
                "p_name",
                "p_owner",
                "true",
                "p_channel",
                "p_lk1",
                "p_lk2",
                "p_lease",
                "p_client",
                "p_host",
                "p_pid",
                "p_value"
            ]
        )
    );
    // A waiter that registers looks again under the name's wake lock (see `WAKE_KEY`): a
    // release under way is waited for, and a name it freed goes to the full path.
    let refuse = format!(
        "IF v_live > 0 THEN
            IF p_busy_ok AND NOT v_odd THEN
                IF p_register THEN
                    PERFORM pg_advisory_xact_lock_shared(hashtextextended('{t}:' || p_name, 0));
                    v_now := {now};
                    {look}
                    IF v_live = 0 OR v_odd THEN
                        RETURN;
                    END IF;
                END IF;
                answer := {BUSY}; wait_ms := v_min - v_now; seen := v_top;
                {register}
            END IF;
            RETURN;
        END IF;"
    );
    format!(
        "CREATE OR REPLACE FUNCTION {r}(
            p_name TEXT, p_owner TEXT, p_kind TEXT, p_permits BIGINT, p_mode TEXT,
            p_lease BIGINT, p_client TEXT, p_host TEXT, p_pid BIGINT, p_value TEXT,
            p_busy_ok BOOLEAN, p_register BOOLEAN, p_registered BOOLEAN, p_channel TEXT,
            p_lk1 INTEGER, p_lk2 INTEGER,
            OUT answer BIGINT, OUT token BIGINT, OUT wait_ms BIGINT, OUT seen BIGINT)
        LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $dlock$
        DECLARE
            v_now BIGINT := {now};
            v_live BIGINT;
            v_odd BOOLEAN;
            v_min BIGINT;
            v_top BIGINT;
            v_dead BIGINT;
            v_queued BOOLEAN;
            v_fence BIGINT;
        BEGIN
            {INDEX_SCANS}
            answer := {FULL}; token := 0; wait_ms := 0; seen := 0;
            {look}
            {refuse}
            IF v_dead > 0 OR v_queued THEN
                RETURN;
            END IF;
            -- The grant is a compare-and-set of the name's fence: every transaction that makes a
            -- hold live takes the next fence under the fence row's lock, so the fence still
            -- being the one the look saw means no hold was granted since (a grant still
            -- uncommitted holds the row lock, and the update waits for it and then sees its
            -- fence). A lost race wrote nothing: no transaction id, no commit flush.
            IF v_fence IS NULL THEN
                -- The name's first grant: the row's insert is the compare (a racing insert
                -- waits for ours and then conflicts).
                INSERT INTO {t}_fences (name, fence) VALUES (p_name, 1)
                    ON CONFLICT (name) DO NOTHING
                    RETURNING fence INTO token;
            ELSIF v_fence < 9223372036854775807 THEN
                UPDATE {t}_fences SET fence = fence + 1
                    WHERE name = p_name AND fence = v_fence
                    RETURNING fence INTO token;
            END IF;
            IF token IS NULL THEN
                -- Lost the race (or an exhausted counter, which the full path reports): look
                -- again for the answer a waiter needs.
                token := 0;
                v_now := {now};
                {look}
                {refuse}
                RETURN;
            END IF;
            INSERT INTO {t} (name, owner, kind, permits, mode, fence, expires_at_ms,
                             acquired_at_ms, client_id, host, pid, value)
                VALUES (p_name, p_owner, p_kind, p_permits, p_mode, token,
                        v_now + p_lease, v_now, p_client, p_host, p_pid, p_value);
            IF p_registered THEN
                DELETE FROM {t}_waiters WHERE name = p_name AND owner = p_owner;
            END IF;
            answer := {GRANTED};
        END
        $dlock$"
    )
}

fn pg_release(t: &str, now: &str) -> String {
    let r = release_routine(t);
    let w = waiters(t);
    format!(
        "CREATE OR REPLACE FUNCTION {r}(p_name TEXT, p_owner TEXT, p_leaving BOOLEAN) RETURNS BIGINT
        LANGUAGE plpgsql SECURITY INVOKER AS $dlock$
        DECLARE
            v_now BIGINT;
            v_token BIGINT;
            v INTEGER;
            v_fair BOOLEAN;
            v_head TEXT;
            v_mode TEXT;
            w RECORD;
        BEGIN
            {INDEX_SCANS}
            -- The name's wake lock (see `WAKE_KEY`): a waiter whose place or registration is
            -- not committed yet is waited for, so the looks below see it.
            PERFORM pg_advisory_xact_lock(hashtextextended('{t}:' || p_name, 0));
            -- The releasing owner waits for nothing: a registration of its own goes (a waiter
            -- that gives up; or an attempt that raced the hand-off to it and registered again).
            DELETE FROM {w} WHERE name = p_name AND owner = p_owner;
            IF NOT EXISTS (SELECT 1 FROM {w} WHERE name = p_name)
               AND NOT EXISTS (SELECT 1 FROM {t}_queue WHERE name = p_name) THEN
                -- Nobody waits: the delete alone, no wake-up, committed without waiting for
                -- the WAL flush (see the module docs).
                PERFORM set_config('synchronous_commit', 'off', true);
                DELETE FROM {t} WHERE name = p_name AND owner = p_owner AND expires_at_ms > {now};
                GET DIAGNOSTICS v = ROW_COUNT;
                RETURN CASE WHEN v > 0 THEN {RELEASED} ELSE {NOT_HELD} END;
            END IF;
            v_fair := EXISTS (SELECT 1 FROM {t}_queue WHERE name = p_name);
            IF v_fair OR EXISTS (SELECT 1 FROM {w} WHERE name = p_name AND handoff) THEN
                -- Lock the name first, as every grant does, then release and hand on. The next
                -- fence is taken only for a hand-off (a token is never spent on nobody).
                PERFORM 1 FROM {t}_fences WHERE name = p_name FOR UPDATE;
                v_now := {now};
                DELETE FROM {t} WHERE name = p_name AND owner = p_owner AND expires_at_ms > v_now;
                GET DIAGNOSTICS v = ROW_COUNT;
                IF v = 0 THEN
                    RETURN {NOT_HELD};
                END IF;
                IF v_fair THEN
                    -- A fair queue: only its head may be handed the lock, as `decide` would
                    -- grant it (the first live place, an exclusive one).
                    SELECT owner, mode INTO v_head, v_mode FROM {t}_queue
                        WHERE name = p_name AND expires_at_ms > v_now
                        ORDER BY seq LIMIT 1;
                    IF v_mode IS DISTINCT FROM 'exclusive' THEN
                        v_head := NULL;
                    END IF;
                END IF;
                IF NOT EXISTS (SELECT 1 FROM {t} WHERE name = p_name AND expires_at_ms > v_now) THEN
                    FOR w IN SELECT owner, channel, lk1, lk2, lease_ms, client_id, host, pid, value
                               FROM {w} WHERE name = p_name AND handoff
                                   AND (NOT v_fair OR owner = v_head)
                               ORDER BY arrived, owner LOOP
                        DELETE FROM {w} WHERE name = p_name AND owner = w.owner;
                        GET DIAGNOSTICS v = ROW_COUNT;
                        -- Gone meanwhile (it gave up), or its client is (its listener's lock
                        -- is free).
                        IF v = 0 OR pg_try_advisory_xact_lock(w.lk1, w.lk2) THEN
                            CONTINUE;
                        END IF;
                        -- An exhausted counter: no hand-off; the name's waiters are woken and
                        -- their attempts report it.
                        UPDATE {t}_fences SET fence = fence + 1
                            WHERE name = p_name AND fence < 9223372036854775807
                            RETURNING fence INTO v_token;
                        IF v_token IS NULL THEN
                            PERFORM pg_notify('{t}', p_name);
                            RETURN {RELEASED};
                        END IF;
                        -- The head's place becomes its hold.
                        IF v_fair THEN
                            DELETE FROM {t}_queue WHERE name = p_name AND owner = w.owner;
                        END IF;
                        INSERT INTO {t} AS h (name, owner, kind, permits, mode, fence,
                                              expires_at_ms, acquired_at_ms, client_id, host,
                                              pid, value)
                            VALUES (p_name, w.owner, 'mutex', 0, 'exclusive', v_token,
                                    v_now + w.lease_ms, v_now, w.client_id, w.host, w.pid,
                                    w.value)
                            ON CONFLICT (name, owner) DO UPDATE
                                SET kind = excluded.kind, permits = excluded.permits,
                                    mode = excluded.mode, fence = excluded.fence,
                                    expires_at_ms = excluded.expires_at_ms,
                                    acquired_at_ms = excluded.acquired_at_ms,
                                    client_id = excluded.client_id, host = excluded.host,
                                    pid = excluded.pid, state = 0, value = excluded.value;
                        PERFORM pg_notify(w.channel, v_token || ' ' || w.owner || ' ' || p_name);
                        -- Waiters that are only woken (readers, an election's observers) are
                        -- told the lock moved; the queue's others wait for their turn.
                        IF EXISTS (SELECT 1 FROM {w} WHERE name = p_name AND NOT handoff) THEN
                            PERFORM pg_notify('{t}', p_name);
                        END IF;
                        RETURN {HANDED_OFF};
                    END LOOP;
                END IF;
            ELSE
                DELETE FROM {t} WHERE name = p_name AND owner = p_owner AND expires_at_ms > {now};
                GET DIAGNOSTICS v = ROW_COUNT;
                IF v = 0 THEN
                    RETURN {NOT_HELD};
                END IF;
            END IF;
            -- Woken, not handed: registrations of clients that are gone go, the rest are told.
            DELETE FROM {w} WHERE name = p_name AND pg_try_advisory_xact_lock(lk1, lk2);
            IF EXISTS (SELECT 1 FROM {w} WHERE name = p_name)
               OR EXISTS (SELECT 1 FROM {t}_queue WHERE name = p_name) THEN
                PERFORM pg_notify('{t}', p_name);
            END IF;
            RETURN {RELEASED};
        END
        $dlock$"
    )
}

fn mysql_grant(t: &str, now: &str, collation: &str) -> String {
    let r = routine(Dialect::MySql, t);
    let answer = |a: i64, token: &str, wait: &str| {
        format!(
            "SELECT CAST({a} AS SIGNED) AS answer, CAST({token} AS SIGNED) AS token, \
             CAST({wait} AS SIGNED) AS wait_ms;"
        )
    };
    let steps = mysql_grant_steps(
        t,
        now,
        collation,
        "NULL",
        "p_busy_ok",
        [
            answer(BUSY, "0", "v_min - v_now"),
            answer(FULL, "0", "0"),
            answer(GRANTED, "v_fence", "0"),
        ],
    );
    format!(
        "CREATE PROCEDURE {r}(
            IN p_name VARCHAR(255) CHARACTER SET utf8mb4,
            IN p_owner VARCHAR(255) CHARACTER SET utf8mb4,
            IN p_kind VARCHAR(16) CHARACTER SET utf8mb4, IN p_permits BIGINT,
            IN p_mode VARCHAR(16) CHARACTER SET utf8mb4, IN p_lease BIGINT,
            IN p_client VARCHAR(255) CHARACTER SET utf8mb4,
            IN p_host VARCHAR(255) CHARACTER SET utf8mb4, IN p_pid BIGINT,
            IN p_busy_ok BOOLEAN)
        MODIFIES SQL DATA
        SQL SECURITY INVOKER
        BEGIN
            DECLARE v_now, v_live, v_odd, v_min, v_dead, v_queued, v_fence BIGINT
                DEFAULT NULL;
            DECLARE EXIT HANDLER FOR SQLEXCEPTION
            BEGIN
                ROLLBACK;
                RESIGNAL;
            END;
            {steps}
        END"
    )
}

/// The grant routine's statements, shared by the ring routine's attempt: one transaction that
/// locks the name's fence row, looks once under it, and grants (a new fence, the hold with
/// `value`) or rolls back. `answers` are the statements that answer busy (when `busy_ok`; the
/// shortest live lease in the way ends in `v_min - v_now`), full path, and granted (`v_fence`).
/// Needs the variables `v_now, v_live, v_odd, v_min, v_dead, v_queued, v_fence` and the
/// parameters `p_name, p_owner, p_kind, p_permits, p_mode, p_lease, p_client, p_host, p_pid`.
fn mysql_grant_steps(
    t: &str,
    now: &str,
    collation: &str,
    value: &str,
    busy_ok: &str,
    answers: [String; 3],
) -> String {
    // No lock-free first look here: InnoDB's row lock on the fence row is cheap to take
    // and a lost race rolls back for free, while every statement of a procedure costs
    // (MariaDB: ~10-25 us each). The fence row is read FOR UPDATE first and created only
    // when missing.
    let c = collation;
    let lock = format!(
        "SELECT fence, {now} INTO v_fence, v_now
             FROM {t}_fences WHERE name = p_name COLLATE {c} FOR UPDATE;"
    );
    let [busy, full, granted] = answers;
    format!(
        "START TRANSACTION;
            -- Lock the name: every grant passes through this row lock.
            {lock}
            IF v_fence IS NULL THEN
                INSERT INTO {t}_fences (name, fence) VALUES (p_name, 0)
                    ON DUPLICATE KEY UPDATE fence = fence;
                {lock}
            END IF;
            -- READ COMMITTED: a fresh read view, every grant committed before the lock
            -- is visible.
            SELECT COALESCE(SUM(expires_at_ms > v_now), 0),
                   COALESCE(MAX(expires_at_ms > v_now AND (owner = p_owner COLLATE {c}
                       OR CAST(kind AS BINARY) <> CAST(p_kind AS BINARY)
                       OR permits <> p_permits)), 0),
                   MIN(IF(expires_at_ms > v_now, expires_at_ms, NULL)),
                   COALESCE(SUM(expires_at_ms <= v_now), 0),
                   (SELECT COUNT(*) FROM {t}_queue WHERE name = p_name COLLATE {c})
              INTO v_live, v_odd, v_min, v_dead, v_queued
              FROM {t} WHERE name = p_name COLLATE {c};
            IF v_live > 0 OR v_dead > 0 OR v_queued > 0
               OR v_fence >= 9223372036854775807 THEN
                -- Refused or not ours to judge: nothing was written.
                ROLLBACK;
                IF v_live > 0 AND {busy_ok} AND v_odd = 0 THEN
                    {busy}
                ELSE
                    {full}
                END IF;
            ELSE
                SET v_fence = v_fence + 1;
                UPDATE {t}_fences SET fence = v_fence WHERE name = p_name COLLATE {c};
                INSERT INTO {t} (name, owner, kind, permits, mode, fence,
                                 expires_at_ms, acquired_at_ms, client_id, host, pid, value)
                    VALUES (p_name, p_owner, p_kind, p_permits, p_mode, v_fence,
                            v_now + p_lease, v_now, p_client, p_host, p_pid, {value});
                COMMIT;
                {granted}
            END IF;"
    )
}

/// An answer row of the MySQL ring routine: `(rung, answer, token, wait_ms)`.
fn ring_answer(rung: &str, answer: i64, token: &str, wait: &str) -> String {
    format!(
        "SELECT CAST({rung} AS SIGNED) AS rung, CAST({answer} AS SIGNED) AS answer, \
         CAST({token} AS SIGNED) AS token, CAST({wait} AS SIGNED) AS wait_ms;"
    )
}

fn mysql_ring(t: &str, now: &str, collation: &str) -> String {
    let r = ring_routine(t);
    let c = collation;
    let timeout = ring_answer("COALESCE(v_got, -1)", BUSY, "0", "0");
    let busy = ring_answer("1", BUSY, "0", "0");
    let full = ring_answer("1", FULL, "0", "0");
    let taken = ring_answer("1", GRANTED, "v_fence", "0");
    // The attempt first (`p_try`): a grant or a "full path" answer ends the call there; a
    // refusal is answered at once (the server sends each result set as it is made) and the
    // call goes on to the bell.
    let tried = |answer: i64, token: &str, wait: &str, ends: bool| {
        let row = ring_answer(&TRIED.to_string(), answer, token, wait);
        format!("{row}\n SET v_ring = {};", if ends { 0 } else { 1 })
    };
    let attempt = mysql_grant_steps(
        t,
        now,
        c,
        "p_value",
        "TRUE",
        [
            tried(BUSY, "0", "v_min - v_now", false),
            tried(FULL, "0", "0", true),
            tried(GRANTED, "v_fence", "0", true),
        ],
    );
    format!(
        "CREATE PROCEDURE {r}(
            IN p_bell VARCHAR(64) CHARACTER SET utf8mb4, IN p_secs BIGINT,
            IN p_name VARCHAR(255) CHARACTER SET utf8mb4,
            IN p_owner VARCHAR(255) CHARACTER SET utf8mb4, IN p_lease BIGINT,
            IN p_client VARCHAR(255) CHARACTER SET utf8mb4,
            IN p_host VARCHAR(255) CHARACTER SET utf8mb4, IN p_pid BIGINT,
            IN p_value VARCHAR(4096) CHARACTER SET utf8mb4, IN p_try BOOLEAN,
            IN p_kind VARCHAR(16) CHARACTER SET utf8mb4, IN p_permits BIGINT,
            IN p_mode VARCHAR(16) CHARACTER SET utf8mb4)
        MODIFIES SQL DATA
        SQL SECURITY INVOKER
        BEGIN
            DECLARE v_got, v_now, v_fence, v_others, v_mine, v_live, v_odd, v_min, v_dead,
                v_queued BIGINT DEFAULT NULL;
            DECLARE v_took BIGINT DEFAULT 0;
            DECLARE v_ring BOOLEAN DEFAULT TRUE;
            DECLARE EXIT HANDLER FOR SQLEXCEPTION
            BEGIN
                ROLLBACK;
                RESIGNAL;
            END;
            IF p_try THEN
                {attempt}
            END IF;
            IF v_ring THEN
                -- The server hands the bell to its askers one at a time, in the order they asked.
                SET v_got = GET_LOCK(p_bell, p_secs);
                IF COALESCE(v_got, 0) <> 1 THEN
                    {timeout}
                ELSE
                    START TRANSACTION;
                    -- The name's fence row lock, as every grant takes it first.
                    SELECT fence, {now} INTO v_fence, v_now
                        FROM {t}_fences WHERE name = p_name COLLATE {c} FOR UPDATE;
                    IF v_fence < 9223372036854775807 THEN
                        -- The hold the bell's last holder reserved for its next one: ours now, with
                        -- the next fence (a reservation nobody takes spends none).
                        UPDATE {t} SET owner = p_owner, state = 0, fence = v_fence + 1,
                                       expires_at_ms = v_now + p_lease, acquired_at_ms = v_now,
                                       client_id = p_client, host = p_host, pid = p_pid,
                                       value = p_value
                            WHERE name = p_name COLLATE {c} AND owner = '' AND state = 3
                              AND expires_at_ms > v_now;
                        SET v_took = ROW_COUNT();
                    END IF;
                    IF v_took = 1 THEN
                        SET v_fence = v_fence + 1;
                        UPDATE {t}_fences SET fence = v_fence WHERE name = p_name COLLATE {c};
                        COMMIT;
                        {taken}
                    ELSE
                        SELECT COALESCE(SUM(expires_at_ms > v_now AND owner <> p_owner COLLATE {c}), 0),
                               MAX(IF(expires_at_ms > v_now AND owner = p_owner COLLATE {c}, 1, NULL))
                          INTO v_others, v_mine
                          FROM {t} WHERE name = p_name COLLATE {c};
                        ROLLBACK;
                        IF v_mine IS NULL AND v_others > 0 THEN
                            -- Held by a holder without the bell: the waiter keeps the bell and
                            -- polls.
                            {busy}
                        ELSE
                            -- A free name, a hold of our own: the waiter attempts, keeping the bell.
                            {full}
                        END IF;
                    END IF;
                END IF;
            END IF;
        END"
    )
}

fn mysql_unring(t: &str, now: &str, collation: &str) -> String {
    let r = unring_routine(t);
    let c = collation;
    // The hold becomes the reservation for whoever the bell wakes (it keeps its fence; the
    // taker takes the next).
    let reserve = format!(
        "UPDATE {t} SET owner = '', state = 3, expires_at_ms = v_now + {RESERVE_MS},
                       acquired_at_ms = v_now, client_id = '', host = '', pid = 0, value = NULL
            WHERE name = p_name COLLATE {c} AND owner = p_owner COLLATE {c}
              AND state = 0 AND expires_at_ms > v_now;"
    );
    format!(
        "CREATE PROCEDURE {r}(
            IN p_bell VARCHAR(64) CHARACTER SET utf8mb4,
            IN p_name VARCHAR(255) CHARACTER SET utf8mb4,
            IN p_owner VARCHAR(255) CHARACTER SET utf8mb4, IN p_reserve BOOLEAN)
        MODIFIES SQL DATA
        SQL SECURITY INVOKER
        BEGIN
            DECLARE v_now BIGINT DEFAULT NULL;
            DECLARE v_gone, v_reserved, v_dup BIGINT DEFAULT 0;
            DECLARE v_mine BOOLEAN DEFAULT FALSE;
            -- A reservation nobody took that outlived its lease is in the way of a new one.
            DECLARE CONTINUE HANDLER FOR 1062 SET v_dup = 1;
            SET v_now = {now};
            SET v_mine = IS_USED_LOCK(p_bell) <=> CONNECTION_ID();
            IF p_reserve AND v_mine
               AND NOT EXISTS (SELECT 1 FROM {t}_queue WHERE name = p_name COLLATE {c}) THEN
                -- Nobody else can be granted a reserved name, so the releasing client's next
                -- waiter cannot take it back first.
                {reserve}
                SET v_reserved = ROW_COUNT();
                IF v_dup = 1 THEN
                    DELETE FROM {t}
                        WHERE name = p_name COLLATE {c} AND owner = '' AND state = 3
                          AND expires_at_ms <= v_now;
                    SET v_dup = 0;
                    {reserve}
                    SET v_reserved = IF(v_dup = 1, 0, ROW_COUNT());
                END IF;
            END IF;
            IF v_reserved = 0 THEN
                DELETE FROM {t}
                    WHERE name = p_name COLLATE {c} AND owner = p_owner COLLATE {c}
                      AND expires_at_ms > v_now;
                SET v_gone = ROW_COUNT();
            ELSE
                SET v_gone = 1;
            END IF;
            -- After the commit (each statement commits on its own): whoever the bell wakes sees
            -- the reservation.
            IF v_mine THEN
                DO RELEASE_LOCK(p_bell);
            END IF;
            IF v_reserved = 1 AND IS_USED_LOCK(p_bell) IS NULL THEN
                -- Nobody asked for the bell: the reservation goes (unless taken meanwhile by
                -- one who asked just now).
                DELETE FROM {t}
                    WHERE name = p_name COLLATE {c} AND owner = '' AND state = 3
                      AND acquired_at_ms = v_now;
                IF ROW_COUNT() > 0 THEN
                    SET v_reserved = 0;
                END IF;
            END IF;
            SELECT CAST(v_gone AS SIGNED) AS released,
                   CAST(IF(v_mine, v_reserved, IS_USED_LOCK(p_bell) IS NOT NULL) AS SIGNED)
                       AS handed;
        END"
    )
}
