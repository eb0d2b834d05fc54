//! The one-round-trip grant of lease mode: a stored routine, `<table>_grant_v1`, that answers
//! the two common cases of an exclusive `acquire` that takes no queue place inside the server — a
//! name with no rows at all (grant) and live holds of other owners (refuse) — and says "take the
//! full path" for everything else. The backend calls it for no other requests (`p_busy_ok` stays
//! in the signature: the routine may refuse), nor for a hold that carries a value
//! ([`crate::backend::HolderMeta::value`], an election's): the full path writes the value, and
//! the routine's bind list stays as it is. The full path (a transaction around `decide`) stays
//! the specification; the routine only ever answers what `decide` would answer.
//!
//! - Both are procedures called with `CALL` on an autocommitted connection that end their own
//!   transaction: `COMMIT` after a grant, `ROLLBACK` when the look under the lock finds the race
//!   lost, so a waiter that loses costs no commit flush. PostgreSQL (11 or newer): PL/pgSQL with
//!   `INOUT` parameters for the answer; MySQL/MariaDB: the answer is the procedure's result set.
//! - Both run at `READ COMMITTED` (PostgreSQL's default; dlock sets it on MySQL sessions): every
//!   statement takes a fresh snapshot, so the look after the fence row lock sees every grant
//!   committed before the lock was ours.
//!
//! On PostgreSQL the routine first looks at the holds and queue without any lock: a refusal or a
//! "full path" answer costs no write, and only a name that looked empty takes the fence row
//! lock, looks again, and grants. On MySQL/MariaDB, where each statement of a procedure costs
//! more and a lost race rolls back for free, it takes the lock and looks once. The routine is created by the migration (under the migration lock) when it is missing;
//! when it cannot be created (no privilege) or is dropped later, the backend logs it once and uses
//! the full path only.

use super::config::Dialect;

/// The routine's name for table `t` (versioned: a changed routine gets a new name, so clients of
/// different dlock versions can share a table).
pub fn routine(t: &str) -> String {
    format!("{t}_grant_v1")
}

/// `answer` of the routine: take the full path.
pub(super) const FULL: i64 = 0;
/// `answer` of the routine: granted with fencing token `token`.
pub(super) const GRANTED: i64 = 1;
/// `answer` of the routine: refused; the shortest live lease in the way ends in `wait_ms`.
pub(super) const BUSY: i64 = 2;

/// The statement that says whether the routine exists (one row, one BIGINT: 0 or 1).
pub(super) fn exists_sql(d: Dialect, t: &str) -> String {
    let r = routine(t);
    match d {
        Dialect::Postgres => format!(
            "SELECT CAST(count(*) AS BIGINT) FROM pg_proc p \
             JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE p.proname = '{r}' AND p.prokind = 'p' AND n.nspname = current_schema()"
        ),
        Dialect::MySql => format!(
            "SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.ROUTINES \
             WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME = '{r}' \
             AND ROUTINE_TYPE = 'PROCEDURE'"
        ),
    }
}

/// The call: binds `name, owner, kind, permits, mode, lease_ms, client_id, host, pid, busy_ok`;
/// answers one row `(answer, token, wait_ms)`, all BIGINT.
pub(super) fn call_sql(d: Dialect, t: &str) -> String {
    let r = routine(t);
    match d {
        Dialect::Postgres => {
            format!("CALL {r}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL, NULL, NULL)")
        }
        Dialect::MySql => format!("CALL {r}(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
    }
}

/// `DROP PROCEDURE` of the routine, if it exists.
pub fn drop_sql(d: Dialect, t: &str) -> String {
    let r = routine(t);
    match d {
        Dialect::Postgres => format!("DROP PROCEDURE IF EXISTS {r}"),
        Dialect::MySql => format!("DROP PROCEDURE IF EXISTS {r}"),
    }
}

/// `CREATE PROCEDURE` of the routine. Both run with the caller's
/// privileges (`SECURITY INVOKER`). `now` is the dialect's millisecond
/// clock expression; `collation` the MySQL key collation (unused on PostgreSQL).
pub(super) fn create_sql(d: Dialect, t: &str, now: &str, collation: &str) -> String {
    let r = routine(t);
    match d {
        Dialect::Postgres => {
            // What the name's hold rows say at v_now: live count, whether a live one is the
            // requester's or of another kind (then `decide` must judge), the earliest live
            // expiry, and the expired count.
            let look = format!(
                "SELECT count(*) FILTER (WHERE expires_at_ms > v_now),
                        coalesce(bool_or(expires_at_ms > v_now AND (owner = p_owner
                            OR kind <> p_kind OR permits <> p_permits)), false),
                        min(expires_at_ms) FILTER (WHERE expires_at_ms > v_now),
                        count(*) FILTER (WHERE expires_at_ms <= v_now),
                        EXISTS (SELECT 1 FROM {t}_queue WHERE name = p_name)
                   INTO v_live, v_odd, v_min, v_dead, v_queued
                   FROM {t} WHERE name = p_name;"
            );
            format!(
                "CREATE PROCEDURE {r}(
                    p_name TEXT, p_owner TEXT, p_kind TEXT, p_permits BIGINT, p_mode TEXT,
                    p_lease BIGINT, p_client TEXT, p_host TEXT, p_pid BIGINT, p_busy_ok BOOLEAN,
                    INOUT answer BIGINT, INOUT token BIGINT, INOUT wait_ms BIGINT)
                LANGUAGE plpgsql SECURITY INVOKER AS $dlock$
                DECLARE
                    v_now BIGINT := {now};
                    v_live BIGINT;
                    v_odd BOOLEAN;
                    v_min BIGINT;
                    v_dead BIGINT;
                    v_queued BOOLEAN;
                BEGIN
                    answer := {FULL}; token := 0; wait_ms := 0;
                    {look}
                    IF v_live > 0 THEN
                        IF p_busy_ok AND NOT v_odd THEN
                            answer := {BUSY}; wait_ms := v_min - v_now;
                        END IF;
                        RETURN;
                    END IF;
                    IF v_dead > 0 OR v_queued THEN
                        RETURN;
                    END IF;
                    -- Lock the name (every grant passes through this row lock) and take the next
                    -- fence; an exhausted counter is left to the full path, which reports it.
                    INSERT INTO {t}_fences AS f (name, fence) VALUES (p_name, 1)
                        ON CONFLICT (name) DO UPDATE SET fence = f.fence + 1
                        WHERE f.fence < 9223372036854775807
                        RETURNING f.fence INTO token;
                    IF token IS NULL THEN
                        ROLLBACK;
                        token := 0;
                        RETURN;
                    END IF;
                    v_now := {now};
                    -- A fresh snapshot: every grant committed before the lock is visible.
                    {look}
                    IF v_live > 0 OR v_dead > 0 OR v_queued THEN
                        -- Lost the race: undo without a commit (no WAL flush).
                        ROLLBACK;
                        token := 0;
                        IF v_live > 0 AND p_busy_ok AND NOT v_odd THEN
                            answer := {BUSY}; wait_ms := v_min - v_now;
                        END IF;
                        RETURN;
                    END IF;
                    INSERT INTO {t} (name, owner, kind, permits, mode, fence, expires_at_ms,
                                     acquired_at_ms, client_id, host, pid)
                        VALUES (p_name, p_owner, p_kind, p_permits, p_mode, token,
                                v_now + p_lease, v_now, p_client, p_host, p_pid);
                    COMMIT;
                    answer := {GRANTED};
                END
                $dlock$"
            )
        }
        Dialect::MySql => {
            // No lock-free first look here: InnoDB's row lock on the fence row is cheap to take
            // and a lost race rolls back for free, while every statement of a procedure costs
            // (MariaDB: ~10-25 us each). The fence row is read FOR UPDATE first and created only
            // when missing.
            let c = collation;
            let lock = format!(
                "SELECT fence, {now} INTO v_fence, v_now
                     FROM {t}_fences WHERE name = p_name COLLATE {c} FOR UPDATE;"
            );
            let answer = |a: i64, token: &str, wait: &str| {
                format!(
                    "SELECT CAST({a} AS SIGNED) AS answer, CAST({token} AS SIGNED) AS token, \
                     CAST({wait} AS SIGNED) AS wait_ms;"
                )
            };
            let full = answer(FULL, "0", "0");
            let busy = answer(BUSY, "0", "v_min - v_now");
            let granted = answer(GRANTED, "v_fence", "0");
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
                    START TRANSACTION;
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
                        IF v_live > 0 AND p_busy_ok AND v_odd = 0 THEN
                            {busy}
                        ELSE
                            {full}
                        END IF;
                    ELSE
                        SET v_fence = v_fence + 1;
                        UPDATE {t}_fences SET fence = v_fence WHERE name = p_name COLLATE {c};
                        INSERT INTO {t} (name, owner, kind, permits, mode, fence,
                                         expires_at_ms, acquired_at_ms, client_id, host, pid)
                            VALUES (p_name, p_owner, p_kind, p_permits, p_mode, v_fence,
                                    v_now + p_lease, v_now, p_client, p_host, p_pid);
                        COMMIT;
                        {granted}
                    END IF;
                END"
            )
        }
    }
}
