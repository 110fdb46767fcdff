"""Targeted mutants of the guarantee-critical code: each one a bug a promise forbids.

A mutant is one exact replacement in one file: ``old`` must occur exactly once (the runner
refuses to run otherwise), ``new`` is the bug. ``tests`` are the tests named for the promise it
breaks (the table in docs/guarantees.md): run alone on a scratch copy of the repository with the
mutant applied, at least one of them must fail. ``fast`` mutants (killed in seconds) take turns
in ``make test``; ``make mutants`` runs them all. How to add one: see CONTRIBUTING.md.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Mutant:
    name: str
    path: str  # relative to the repository root
    old: str  # must occur exactly once in the file
    new: str
    promise: str  # the Guarantees-table promise it breaks
    tests: tuple[str, ...]  # pytest node ids named for that promise
    fast: bool = False  # cheap enough for the rotating subset in `make test`


# The promises, as the Guarantees table names them.
EXACTLY_ONCE = "At-least-once in, exactly-once effect"
ACK_AFTER_COMMIT = "Ack after commit, one delivery at a time"
REFUSED_ROW = "A row PostgreSQL refuses is isolated"
OUTAGE = "An outage is not bad data"
BROKER_LOSS = "Broker loss"
REPLICAS = "Replicas"
SHUTDOWN = "Orderly shutdown"
BAD_SETTINGS = "Bad settings fail at start-up"
PRODUCER = "Producer side"
AUTH = "Every /v1 call is authenticated, scoped and isolated per client"
TLS = "TLS, proven"
LEAST_PRIVILEGE = "Least privilege"
NODE_LOSS = "Broker node loss"
DB_FAILOVER = "Database failover"
EXACT_AMOUNTS = "Amounts are exact"
BAD_DATA = "Bad data never holds the batch"
DLQ_BY_REASON = "The DLQ is worked by reason"
OTHER_CLIENTS = "Messages from other clients"
TIME_ORDERED_IDS = "Ids this project makes are time-ordered"
RETENTION = "Tables that only grow have a window"
INDEXES = "Every index serves a query of the project"
PARTITIONED = "Partitioned ledger tables"
UPLOADS = "Job uploads are bounded; every job completes"
NETWORK_PARTITIONS = "Network partitions"
SHARDS = "Queue shards"

T_RECORDER = "tests/integration/test_recorder.py::"
T_IDS = "tests/unit/test_ids.py::"
T_RETENTION = "tests/integration/test_retention.py::"
T_RETENTION_BUSY = (
    "tests/faults/test_retention_busy.py::test_retention_of_a_day_never_holds_a_busy_writer_100_ms"
)
T_PARTITIONS = "tests/integration/test_partitions.py::"
PARTITIONING_SQL = "bulk_recorder/sql/partitioning/partitioned_ledger.sql"
T_RIG_ANSWERS = "tests/cluster/test_rigs.py::test_a_nodes_answers_over_erl_call_are_rabbitmqctls"
T_RIG_ROW_ENDS = (
    "tests/cluster/test_rigs.py::"
    "test_a_queue_that_ends_while_the_rows_are_asked_is_left_out_as_rabbitmqctl_does"
)
T_DLQ_PROPERTIES = (
    "tests/integration/test_dlq_properties.py::"
    "test_dead_letter_and_replay_keep_the_message_properties"
)
T_OUTBOX_STATS = (
    "tests/integration/test_outbox_stats.py::"
    "test_outbox_gauges_count_waiting_rows_and_the_oldest_ones_age"
)
T_RELAY_WAKES = "tests/integration/test_relay_wakes.py::"
T_RELAY_CLAIM = "tests/integration/test_relay_claim.py::"
T_CLAIM_CURSOR = "tests/unit/test_claim_cursor.py::"
T_BALANCES = "tests/integration/test_balances.py::"
T_E2E = "tests/integration/test_e2e.py::"
T_OUTBOX = "tests/integration/test_outbox.py::"
T_AUTH = "tests/faults/test_auth_refusals.py::"
T_API = "tests/integration/test_api.py::"
T_PROPERTY = "tests/unit/test_flusher_property.py::"
T_FRAMES = "tests/faults/test_ack_frames.py::"
T_DB_ERRORS = "tests/faults/test_db_errors.py::"
T_OUTAGE = "tests/faults/test_db_outage.py::"
T_ROLES = "tests/integration/test_roles.py::"
T_TLS = "tests/faults/test_tls.py::"
T_WRITER_FAULTS = (
    "tests/integration/test_writer_faults.py::"
    "test_a_fault_at_a_flushs_last_statement_leaves_nothing_and_the_retry_is_exact"
)
T_EXACT = "tests/integration/test_exact_amounts.py::"
T_DLQ = "tests/integration/test_dlq.py::"
T_BY_REASON = "tests/integration/test_dlq_by_reason.py::"
T_ARRIVALS = "tests/integration/test_dlq_arrivals.py::"
T_PACE = "tests/integration/test_dlq_give_back_pace.py::"
T_GIVE_BACK_WAIT = "tests/unit/test_dlq_give_back_wait.py::"
T_CLIENTS = "tests/integration/test_other_clients.py::"

SORTED_KEYS_TESTS = (
    T_BALANCES + "test_every_write_sends_its_keys_in_sorted_order",
    T_BALANCES + "test_concurrent_writers_on_hot_accounts_neither_deadlock_nor_drift",
)

MEASURED = "The two numbers are measured"

SPEC = "The OpenAPI document says what the API accepts"

TRACED = "One record's trace is followed from the API to the commit"
LOGS = "Nothing from outside forges a log line or grows the log; no password in any form"
HEALTH = "One health check for every role, on its own port"
START_COST = "A command loads and runs only what it needs to start"
T_START_COST = "tests/unit/test_start_cost.py::"
T_HEALTH = "tests/integration/test_healthcheck.py::"
T_READY = "tests/integration/test_readiness.py::"
T_SHARDS = "tests/cluster/test_shards.py::"
T_LEFTOVERS = "tests/integration/test_shard_leftovers.py::"
T_LATE = "tests/integration/test_late_counts.py::"
T_LEAN = "tests/faults/test_lean_acks.py::"
T_SETTINGS = "tests/unit/test_settings.py::"
T_TRACE = (
    "tests/integration/test_tracing.py::"
    "test_a_request_is_followed_from_the_api_to_the_flush_that_links_it"
)

ALERTS = "deploy/prometheus/alerts.yml"
T_ALERT_RULES = "tests/ops/test_alerts.py::test_alert_rules_pass_promtool_check_and_unit_tests"


def alert_rule(*, name: str, old: str, new: str) -> Mutant:
    """A bug in the alert rules that ``promtool`` (its check and the rules' unit tests) catches."""
    return Mutant(
        name=name,
        path=ALERTS,
        old=old,
        new=new,
        promise="Operable",
        tests=(T_ALERT_RULES,),
        fast=True,
    )


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="ack-before-commit",
        path="bulk_recorder/recorder/flusher.py",
        old="                await self._isolate(live, outcome)\n",
        new=(
            "                outcome.committed.extend(live)\n"
            "                await self._settle(outcome, [])\n"
            "                outcome.committed.clear()\n"
            "                await self._isolate(live, _Outcome())\n"
        ),
        promise=ACK_AFTER_COMMIT,
        tests=(
            T_RECORDER + "test_no_delivery_is_acked_before_its_row_is_committed",
            T_FRAMES + "test_every_ack_frame_is_single_once_on_its_channel_and_after_its_commit",
        ),
        fast=True,
    ),
    Mutant(
        name="ack-multiple",
        path="bulk_recorder/infra/aiormq_internals.py",
        old="spec.Basic.Ack(delivery_tag=t)",
        new="spec.Basic.Ack(delivery_tag=t, multiple=True)",
        promise=ACK_AFTER_COMMIT,
        tests=(
            T_PROPERTY + "test_flusher_acks_exactly_the_committed_deliveries",
            T_FRAMES + "test_every_ack_frame_is_single_once_on_its_channel_and_after_its_commit",
        ),
        fast=True,
    ),
    Mutant(
        name="no-on-conflict-transactions",
        path="bulk_recorder/recorder/statements.py",
        old="metadata, n)\nORDER BY u.n\nON CONFLICT (id) DO NOTHING\n",
        new="metadata, n)\nORDER BY u.n\n",
        promise=EXACTLY_ONCE,
        tests=(
            T_RECORDER + "test_duplicates_give_one_row_and_count_as_ignored",
            T_RECORDER + "test_a_duplicate_in_a_later_flush_changes_nothing",
        ),
    ),
    Mutant(
        name="no-on-conflict-annotations",
        path="bulk_recorder/recorder/statements.py",
        old="reason, n)\nORDER BY u.n\nON CONFLICT (id) DO NOTHING\n",
        new="reason, n)\nORDER BY u.n\n",
        promise=EXACTLY_ONCE,
        tests=(
            T_RECORDER + "test_duplicates_give_one_row_and_count_as_ignored",
            T_RECORDER + "test_a_duplicate_in_a_later_flush_changes_nothing",
        ),
    ),
    Mutant(
        name="balances-for-old-ids",
        path="bulk_recorder/recorder/statements.py",
        old="delta, n)\nJOIN new_transactions AS fresh ON fresh.id = u.transaction_id::uuid\n",
        new="delta, n)\n",
        promise=EXACTLY_ONCE,
        tests=(
            T_RECORDER + "test_duplicates_give_one_row_and_count_as_ignored",
            T_RECORDER + "test_a_duplicate_in_a_later_flush_changes_nothing",
        ),
        fast=True,
    ),
    Mutant(  # the same bug, caught by the newcomer's command: the demo sends 5% duplicates
        name="balances-for-old-ids-in-the-demo",
        path="bulk_recorder/recorder/statements.py",
        old="delta, n)\nJOIN new_transactions AS fresh ON fresh.id = u.transaction_id::uuid\n",
        new="delta, n)\n",
        promise=EXACTLY_ONCE,
        tests=("tests/integration/test_demo.py::test_demo_passes_its_checks",),
    ),
    Mutant(
        name="unsorted-balance-keys",
        path="bulk_recorder/recorder/statements.py",
        old="contributions = sorted(",
        new="contributions = list(",
        promise=REPLICAS,
        tests=SORTED_KEYS_TESTS,
        fast=True,
    ),
    Mutant(
        name="unsorted-ids",
        path="bulk_recorder/recorder/writer.py",
        old="unique = sorted(seen.values(), key=_record_id)",
        new="unique = list(seen.values())",
        promise=REPLICAS,
        tests=SORTED_KEYS_TESTS,
        fast=True,
    ),
    Mutant(
        name="unsorted-operation-ids",
        path="bulk_recorder/recorder/statements.py",
        old="for op in t.operations), key=_operation_id)",
        new="for op in t.operations), key=lambda pair: pair[1].id)",
        promise=REPLICAS,
        tests=SORTED_KEYS_TESTS,
        fast=True,
    ),
    Mutant(
        name="outage-codes-as-data",
        path="bulk_recorder/infra/errors.py",
        old='_DATA_CLASSES = ("22", "23", "54")',
        new='_DATA_CLASSES = ("22", "23", "54", "40", "57")',
        promise=OUTAGE,
        tests=(
            T_DB_ERRORS + "test_admin_shutdown_of_the_flush_is_an_outage",
            T_DB_ERRORS + "test_deadlock_victim_flush_is_an_outage",
            T_DB_ERRORS + "test_serialization_failure_of_the_flush_is_an_outage",
        ),
    ),
    Mutant(
        name="every-db-error-as-data",
        path="bulk_recorder/infra/errors.py",
        old='return TransientDbError(f"{type(exc).__name__}: {exc}"[:300])',
        new='return DataRejected(f"{type(exc).__name__}: {exc}"[:300])',
        promise=OUTAGE,
        tests=(
            T_OUTAGE + "test_outage_pauses_marks_not_ready_and_dead_letters_nothing",
            T_OUTAGE + "test_sigterm_during_an_outage_then_a_recorder_started_while_the_database"
            "_is_down",
        ),
    ),
    Mutant(
        name="poison-acked",
        path="bulk_recorder/recorder/flusher.py",
        old="outcome.poison.append((items[0], exc.reason))",
        new="outcome.committed.append(items[0])",
        promise=REFUSED_ROW,
        tests=(
            T_PROPERTY + "test_flusher_acks_exactly_the_committed_deliveries",
            "tests/faults/test_poison.py::test_refused_rows_are_isolated_retried_then_dead_lettered",
        ),
        fast=True,
    ),
    Mutant(
        name="no-final-flush",
        path="consumer/app.py",
        old='self._collector.flush("shutdown")',
        new="pass",
        promise=SHUTDOWN,
        tests=(
            T_E2E + "test_sigterm_with_records_still_buffered_commits_and_acks_them_all",
            T_RECORDER + "test_shutdown_flushes_the_partial_batch_and_acks_it",
        ),
    ),
    Mutant(
        name="stale-tags-acked-on-the-new-channel",
        path="consumer/app.py",
        old="ack_many=ack_each,",
        new=(
            "ack_many=lambda ds: ack_each([AmqpDelivery(self._consuming.channel or d.channel,"
            " d._message,"
            " d._dead_letterer) for d in ds]),"
        ),
        promise=BROKER_LOSS,
        tests=(
            T_FRAMES + "test_a_flush_whose_channel_died_mid_write_is_never_acked_on_the_new"
            "_channel",
        ),
    ),
    Mutant(
        name="outbox-row-deleted-before-the-confirm",
        path="bulk_recorder/producer/relay_batch.py",
        old="rows = await claim(conn, self.cursor, self.config.batch_size, window)\n",
        new=(
            "rows = await claim(conn, self.cursor, self.config.batch_size, window)\n"
            '        await conn.execute(_DELETE_SENT, [r["id"] for r in rows])\n'
        ),
        promise=PRODUCER,
        tests=(T_OUTBOX + "test_publishes_without_a_confirm_leave_their_rows_in_the_outbox",),
    ),
    Mutant(
        name="job-idempotency-key-not-checked",
        path="bulk_recorder/producer/api/jobs.py",
        old="_INSERT_JOB,\n                        job_id,\n                        key,\n",
        new="_INSERT_JOB,\n                        job_id,\n                        None,\n",
        promise=PRODUCER,
        tests=(T_API + "test_job_idempotency_key_returns_the_same_job",),
        fast=True,
    ),
    Mutant(
        name="job-worker-death-fails-the-job",
        path="bulk_recorder/producer/job_workers.py",
        old="            except BrokenProcessPool:\n                self._broken(executor)\n",
        new="            except BrokenProcessPool:\n                self._broken(executor)\n"
        "                raise\n",
        promise=UPLOADS,
        tests=(
            "tests/faults/test_job_workers.py::"
            "test_a_worker_killed_mid_upload_costs_the_job_nothing_and_workers_end_with_the_api",
        ),
    ),
    Mutant(
        name="job-block-repeats-inside-a-block-accepted",
        path="bulk_recorder/producer/job_blocks.py",
        old="if self._seen.keys().isdisjoint(ids) and len(set(ids)) == len(ids):",
        new="if self._seen.keys().isdisjoint(ids):",
        promise=UPLOADS,
        tests=("tests/unit/test_job_blocks.py::test_blocks_give_the_same_job_as_the_loop",),
        fast=True,
    ),
    Mutant(
        name="job-status-recounts-on-the-request-path",
        path="bulk_recorder/producer/api/jobs.py",
        old="    if cached is None:\n        recorded = int(",
        new="    if True:\n        recorded = int(",
        promise=UPLOADS,
        tests=(
            "tests/integration/test_job_progress.py::"
            "test_a_status_read_never_waits_for_the_recount_of_a_job",
        ),
    ),
    Mutant(
        name="job-never-stalled",
        path="bulk_recorder/producer/api/job_status.py",
        old='elif float(row["quiet_s"]) >= stall_after_s and _relay_quiet(row, stall_after_s):',
        new="elif False:",
        promise=PRODUCER,
        tests=(
            "tests/unit/test_job_status.py::test_stalled_once_nothing_was_published_for_the_stall"
            "_time",
            "tests/integration/test_job_stall.py::test_relay_stopped_mid_job_shows_unsent_rows"
            "_their_age_then_stalled_then_completes",
        ),
    ),
    Mutant(
        name="transaction-idempotency-key-not-checked",
        path="bulk_recorder/producer/api/transactions.py",
        old="_INSERT_REQUEST, record.id, key, request_hash",
        new="_INSERT_REQUEST, record.id, None, request_hash",
        promise=PRODUCER,
        tests=(T_API + "test_async_transaction_202_with_one_outbox_row_and_repeats_answered_once",),
        fast=True,
    ),
    Mutant(
        name="revoked-key-accepted",
        path="bulk_recorder/producer/api/auth.py",
        old="if found.revoked_at is not None:",
        new="if False:",
        promise=AUTH,
        tests=(
            T_AUTH
            + "test_no_bad_or_revoked_key_is_401_a_missing_scope_403_counted_and_never_logged",
        ),
        fast=True,
    ),
    Mutant(
        name="scope-not-checked",
        path="bulk_recorder/producer/api/auth.py",
        old='allowed = scope in principal.scopes or (scope == "jobs:read" and principal.admin)',
        new="allowed = True",
        promise=AUTH,
        tests=(
            T_AUTH
            + "test_no_bad_or_revoked_key_is_401_a_missing_scope_403_counted_and_never_logged",
            T_AUTH
            + "test_another_clients_job_is_404_like_a_missing_one_and_an_admin_key_reads_every_job",
        ),
        fast=True,
    ),
    Mutant(
        name="job-visible-to-every-client",
        path="bulk_recorder/producer/api/auth.py",
        old="return self.admin or owner == self.client",
        new="return True",
        promise=AUTH,
        tests=(
            T_AUTH
            + "test_another_clients_job_is_404_like_a_missing_one_and_an_admin_key_reads_every_job",
        ),
        fast=True,
    ),
    Mutant(
        name="job-idempotency-key-global",
        path="bulk_recorder/producer/api/jobs.py",
        old="WHERE idempotency_key = $1 AND client = $2",
        new="WHERE idempotency_key = $1 AND $2::text IS NOT NULL",
        promise=AUTH,
        tests=(
            T_AUTH + "test_idempotency_keys_are_per_client_and_the_transaction_id_409_stays_global",
        ),
        fast=True,
    ),
    Mutant(
        name="transaction-replayed-to-another-client",
        path="bulk_recorder/producer/api/transactions.py",
        old='if prior["client"] != client:',
        new="if False:",
        promise=AUTH,
        tests=(
            T_AUTH + "test_idempotency_keys_are_per_client_and_the_transaction_id_409_stays_global",
        ),
        fast=True,
    ),
    Mutant(
        name="bad-setting-exit-code-1",
        path="settings.py",
        old="    exit_code = EXIT_SETTINGS\n",
        new="    exit_code = 1\n",
        promise=BAD_SETTINGS,
        tests=(
            "tests/faults/test_bad_input.py::test_a_bad_setting_stops_consume_naming_the_variable",
        ),
        fast=True,
    ),
    Mutant(
        name="service-role-may-truncate",
        path="bulk_recorder/sql/roles/grants.sql",
        old="'GRANT SELECT, INSERT ON %1$s.transactions, %1$s.credit_annotations TO",
        new="'GRANT SELECT, INSERT, TRUNCATE ON %1$s.transactions, %1$s.credit_annotations TO",
        promise=LEAST_PRIVILEGE,
        tests=(T_ROLES + "test_roles_are_refused_ddl_and_other_writes_and_migrate_needs_none",),
        fast=True,
    ),
    Mutant(
        name="migrate-takes-the-lock-and-ddl-when-up-to-date",
        path="bulk_recorder/infra/migrate.py",
        old="                check_unedited(recorded)\n                return []\n",
        new="                check_unedited(recorded)\n",
        promise=LEAST_PRIVILEGE,
        tests=(T_ROLES + "test_roles_are_refused_ddl_and_other_writes_and_migrate_needs_none",),
        fast=True,
    ),
    Mutant(
        name="tls-refusal-not-named",
        path="bulk_recorder/infra/tls.py",
        old="    error = tls_error(exc)\n",
        new="    error = None\n",
        promise=TLS,
        tests=(T_TLS + "test_a_certificate_from_another_ca_is_one_line_naming_the_setting",),
    ),
    Mutant(
        name="publisher-nack-as-refusal",
        path="bulk_recorder/producer/relay_batch.py",
        old="elif isinstance(outcome, ChannelRefusal):",
        new="elif isinstance(outcome, aiormq.exceptions.DeliveryError | ChannelRefusal):",
        promise=NODE_LOSS,
        tests=(
            "tests/faults/test_relay_nack.py::"
            "test_a_nacked_publish_leaves_the_row_untouched_and_replaces_the_channel",
        ),
        fast=True,
    ),
    Mutant(
        name="one-timeout-for-every-database-host",
        path="bulk_recorder/infra/pg_hosts.py",
        old='    kwargs.pop("timeout", None)\n    target = parse(dsn)\n',
        new=(
            '    kwargs.pop("timeout", None)\n'
            '    return await asyncpg.connect(dsn.split("&connect_timeout")[0], **kwargs)\n'
        ),
        promise=DB_FAILOVER,
        tests=("tests/integration/test_db_hosts.py::test_every_command_passes_over_a_silent_host",),
    ),
    Mutant(
        name="flush-shape-decided-on-transactions-only",
        path="bulk_recorder/recorder/writer.py",
        old="            max(len(transactions), operations) <= self._tx_rows\n",
        new="            len(transactions) <= self._tx_rows\n",
        promise=EXACTLY_ONCE,
        tests=(T_WRITER_FAULTS,),
        fast=True,
    ),
    Mutant(
        name="many-chunk-balances-overwritten",
        path="bulk_recorder/recorder/statements.py",
        old='DO UPDATE SET available = b.available + EXCLUDED.available, updated_at = now()\n"""\n',
        new='DO UPDATE SET available = EXCLUDED.available, updated_at = now()\n"""\n',
        promise=EXACTLY_ONCE,
        tests=(T_WRITER_FAULTS,),
        fast=True,
    ),
    Mutant(
        name="job-repeats-skipped-for-an-in-flush-repeat",
        path="bulk_recorder/recorder/writer.py",
        old="        if inserted < len(records):",
        new="        if inserted < len(anns):",
        promise=EXACTLY_ONCE,
        tests=(
            "tests/integration/test_job_progress.py::"
            "test_two_jobs_sending_one_id_in_one_flush_each_count_it_after_that_flush",
        ),
        fast=True,
    ),
    Mutant(
        name="falsy-job-id-taken-for-none",
        # An empty id slips past the schema's length, and "" + nothing is read as no job.
        path="bulk_recorder/records/schema.py",
        old="min_length=36,",
        new="min_length=0,",
        promise=BAD_DATA,
        tests=(
            "tests/unit/test_records.py::"
            "test_only_null_or_absent_means_no_job_a_falsy_job_id_is_rejected",
        ),
        fast=True,
    ),
    Mutant(
        name="debit-negated-in-the-default-context",
        path="bulk_recorder/records/exact.py",
        old="op.amount.copy_negate()",
        new="-op.amount",
        promise=EXACT_AMOUNTS,
        tests=(
            T_EXACT
            + "test_the_contracts_extreme_amounts_balance_to_the_last_digit_in_every_writer_path",
            T_EXACT + "test_the_api_in_sync_mode_records_the_contracts_extreme_amounts_exactly",
        ),
        fast=True,
    ),
    Mutant(
        name="release-fallback-nack-dead-letters",
        path="consumer/delivery.py",
        old="basic_nack(self.tag, requeue=True)",
        new="basic_nack(self.tag, requeue=False)",
        promise=OUTAGE,
        tests=(
            T_OUTAGE
            + "test_a_release_whose_copy_the_broker_refuses_is_requeued_never_dead_lettered",
        ),
        fast=True,
    ),
    Mutant(
        name="broker-cancel-ignored",
        path="consumer/consuming.py",
        old="{closed, channel.closing, stopped, cancelled}",
        new="{closed, channel.closing, stopped}",
        promise=BROKER_LOSS,
        tests=(
            "tests/faults/test_queue_deleted.py::"
            "test_the_recorder_declares_its_deleted_queue_again_with_the_contract_arguments",
        ),
    ),
    Mutant(
        name="gone-shard-without-cancel-ignored",
        path="consumer/consuming.py",
        old="lost = sorted(queue for queue in gone if queue in self._tags)",
        new="lost: list[str] = []",
        promise=BROKER_LOSS,
        tests=(
            "tests/unit/test_consuming_gone.py::"
            "test_a_held_shard_found_gone_through_the_current_connection_is_taken_as_cancelled",
            "tests/faults/test_queue_deleted.py::"
            "test_a_deleted_queue_whose_cancel_is_lost_is_declared_again_at_the_next_look",
        ),
        fast=True,
    ),
    Mutant(
        name="watch-never-reports-a-gone-shard",
        path="consumer/queue_watch.py",
        old="                gone.add(topology.shard_queue(number))",
        new="                pass",
        promise=BROKER_LOSS,
        tests=(
            "tests/faults/test_queue_deleted.py::"
            "test_a_deleted_queue_whose_cancel_is_lost_is_declared_again_at_the_next_look",
        ),
    ),
    Mutant(
        name="gone-shard-seen-through-an-older-connection-acted-on",
        path="consumer/consuming.py",
        old="if looked_through is None or looked_through is connection:",
        new="if True:",
        promise=BROKER_LOSS,
        tests=(
            "tests/unit/test_consuming_gone.py::"
            "test_a_look_through_an_older_connection_changes_nothing",
        ),
        fast=True,
    ),
    Mutant(
        name="unroutable-return-as-refusal",
        path="bulk_recorder/producer/relay_batch.py",
        old="unroutable += 1  # our queue or its binding is gone: not the row's fault",
        new='refused.append(row["id"])\n                reasons.append("returned")',
        promise=PRODUCER,
        tests=(
            "tests/faults/test_relay_unroutable.py::"
            "test_a_deleted_queue_is_redeclared_by_the_relay_and_no_row_is_charged_or_parked",
        ),
        fast=True,
    ),
    Mutant(
        name="unpark-keeps-the-job-counts",
        path="consumer/tools/outbox.py",
        old="await conn.execute(_UNCOUNT, jobs, [done.per_job[j] for j in jobs])",
        new="pass",
        promise=PRODUCER,
        tests=(
            "tests/integration/test_outbox_unpark.py::"
            "test_outbox_unpark_puts_parked_rows_back_and_keeps_job_counts_right",
        ),
        fast=True,
    ),
    Mutant(
        name="relay-activity-not-stamped",
        path="bulk_recorder/producer/relay_batch.py",
        old="await stamp_published(conn)  # any row: a job's status tells a busy relay by it",
        new="pass",
        promise=PRODUCER,
        tests=(
            "tests/integration/test_job_stall.py::"
            "test_a_job_behind_transaction_rows_reads_publishing_while_the_relay_batches_them",
        ),
        fast=True,
    ),
    Mutant(
        name="relay-retries-a-topology-mismatch",
        path="bulk_recorder/producer/relay.py",
        old="fatal=(TopologyMismatch,),  # the broker refuses our topology: retrying cannot help",
        new="fatal=(),",
        promise=BAD_SETTINGS,
        tests=(
            "tests/integration/test_topology.py::"
            "test_relay_with_other_queue_arguments_exits_3_naming_the_queue_and_the_mismatch",
        ),
    ),
    Mutant(
        name="claim-window-from-parked-rows",
        path="bulk_recorder/producer/relay_claim.py",
        old="    WHERE parked_at IS NULL AND available_at <= now() AND id >= $3\n",
        new="    WHERE id >= $3\n",
        promise=PRODUCER,
        tests=(
            "tests/integration/test_relay_batch.py::"
            "test_a_parked_row_far_below_the_rest_holds_up_nothing",
        ),
    ),
    Mutant(
        name="claim-from-the-start-of-the-outbox",
        path="bulk_recorder/producer/relay_claim.py",
        old="await conn.fetch(CLAIM, batch_size, window, began_at)",
        new="await conn.fetch(CLAIM, batch_size, window, 0)",
        promise=PRODUCER,
        tests=(
            T_RELAY_CLAIM + "test_a_claim_after_churn_held_by_a_long_transaction_reads_what_a"
            "_fresh_one_does",
        ),
    ),
    Mutant(
        name="claim-planned-with-every-scan",
        path="bulk_recorder/producer/relay_claim.py",
        old="    await conn.execute(INDEX_SCANS_ONLY)\n",
        new="",
        promise=PRODUCER,
        tests=(
            T_RELAY_CLAIM + "test_a_claim_walks_the_index_whatever_the_planner_makes_of_the"
            "_statistics",
        ),
    ),
    Mutant(
        name="claim-leaves-index-scans-only-on",
        path="bulk_recorder/producer/relay_claim.py",
        old="    await conn.execute(EVERY_SCAN)\n",
        new="",
        promise=PRODUCER,
        tests=(T_RELAY_CLAIM + "test_the_statements_after_the_claim_plan_with_every_scan",),
    ),
    Mutant(
        name="claim-rescan-never-after-the-first",
        path="bulk_recorder/producer/relay_claim.py",
        old="self._rescan_due = self._clock() + max(RESCAN_EVERY_S, RESCAN_COST_FACTOR * took_s)",
        new='self._rescan_due = float("inf")',
        promise=PRODUCER,
        tests=(
            T_RELAY_CLAIM + "test_a_row_committed_late_below_the_cursor_is_published",
            T_CLAIM_CURSOR + "test_a_rescan_comes_every_second_or_ten_times_its_cost",
        ),
    ),
    Mutant(
        name="claim-cursor-raised-over-a-rescan",
        path="bulk_recorder/producer/relay_claim.py",
        old="elif start is not None and self.floor == began_at:",
        new="elif start is not None:",
        promise=PRODUCER,
        tests=(
            T_CLAIM_CURSOR + "test_a_claim_that_began_before_a_rescan_lowered_the_cursor_leaves"
            "_it_there",
        ),
        fast=True,
    ),
    Mutant(
        name="outbox-vacuumed-at-the-default-scale",
        path="bulk_recorder/sql/010_outbox_churn.sql",
        old="autovacuum_vacuum_scale_factor = 0,",
        new="autovacuum_vacuum_scale_factor = 0.2,",
        promise=PRODUCER,
        tests=(
            T_RELAY_CLAIM + "test_the_outbox_is_vacuumed_after_a_fixed_number_of_dead_rows_at"
            "_full_speed",
        ),
    ),
    Mutant(
        name="relay-write-wait-unbounded",
        path="bulk_recorder/producer/relay_batch.py",
        old="            async with asyncio.timeout(self.config.publish_timeout_s):\n"
        "                futures = await write_publishes(",
        new="            async with asyncio.timeout(None):\n"
        "                futures = await write_publishes(",
        promise=BROKER_LOSS,
        tests=(
            "tests/faults/test_relay_write_queue.py::"
            "test_a_lane_whose_connection_died_with_its_writes_queued_comes_back",
        ),
    ),
    Mutant(
        name="error-answer-not-problem-json",
        path="bulk_recorder/producer/api/problems.py",
        old="        media_type=PROBLEM_MEDIA_TYPE,\n",
        new="",
        promise=PRODUCER,
        tests=(
            "tests/integration/test_api_problems.py::"
            "test_every_error_answer_is_problem_json_with_the_detail_clients_read",
        ),
        fast=True,
    ),
    Mutant(
        name="uuid-hyphens-anywhere",
        # msgspec checks only a UUID's length; rules.lowered_uuids its shape. Compared as counts of
        # each class, not position by position, a moved hyphen passes (and so would 32 hex
        # digits plus 4 hyphens in any order).
        path="bulk_recorder/records/rules.py",
        old="    if joined.encode().translate(_UUID_CLASSES) == shape:\n",
        new="    if sorted(joined.encode().translate(_UUID_CLASSES)) == sorted(shape):\n",
        promise=BAD_DATA,
        tests=("tests/unit/test_records.py::test_invalid_uuid",),
        fast=True,
    ),
    Mutant(
        name="healthcheck-probes-the-recorders-port-whatever-the-role",
        path="consumer/healthcheck.py",
        old='return _probe_host(settings.metrics_host), port, "METRICS_PORT"',
        new='return _probe_host(settings.metrics_host), 9464, "METRICS_PORT"',
        promise="One health check for every role, on its own port",
        tests=(
            "tests/integration/test_healthcheck.py::"
            "test_healthcheck_is_healthy_on_the_roles_own_port_and_unhealthy_when_it_stops",
        ),
    ),
    Mutant(
        name="shutdown-closes-with-copies-under-way",
        path="consumer/app.py",
        old="        await self._finish_copies(deadline)\n",
        new="",
        promise=SHUTDOWN,
        tests=(
            "tests/faults/test_db_outage.py::"
            "test_sigterm_during_an_outage_acks_every_released_copy_before_closing",
        ),
    ),
    Mutant(
        name="close-before-the-broker-applies-the-last-acks",
        path="consumer/consuming.py",
        old="        if any(not channel.is_closed for channel in shard_channels):\n"
        "            with broker_failures_suppressed(), contextlib.suppress(TimeoutError):",
        new="        if False:\n"
        "            with broker_failures_suppressed(), contextlib.suppress(TimeoutError):",
        promise=SHUTDOWN,
        tests=(
            # the rounds catch it only when the broker is slow to apply (a race); the suspended
            # leader, every time
            T_LEAN + "test_acks_the_queue_applies_late_are_waited_for",
            T_LEAN + "test_the_last_acks_before_our_own_close_are_applied_by_a_quorum_queue",
        ),
        fast=True,
    ),
    Mutant(
        name="rig-keeps-a-stale-partition-record",
        path="tests/partitions/conftest.py",
        old="                reset.check(nodes, partitions if view[0] == expected else {})\n",
        new="                reset.check(nodes, {})\n",
        promise=NETWORK_PARTITIONS,
        tests=(
            "tests/partitions/test_rig.py::"
            "test_a_partition_still_recorded_while_every_node_runs_is_cleared",
        ),
    ),
    Mutant(
        name="close-lingers-instead-of-waiting-for-the-acks",
        path="consumer/consuming.py",
        old="                    await wait_applied("
        "self.by_queue, self._with_ours, shard_channels)\n",
        new="                    await asyncio.sleep(0.2)\n",  # the linger it had
        promise=SHUTDOWN,
        tests=(T_LEAN + "test_acks_the_queue_applies_late_are_waited_for",),
    ),
    Mutant(
        name="stop-cancels-without-the-count-the-close-waits-on",
        path="consumer/consuming.py",
        old="                        if for_good:  # what the close waits to see fall",
        new="                        if False:  # what the close waits to see fall",
        promise=SHUTDOWN,
        tests=(T_LEAN + "test_acks_the_queue_applies_late_are_waited_for",),
    ),
    Mutant(
        name="acks-taken-for-applied-at-the-same-consumer-count",
        path="consumer/queue_count.py",
        old="        if count.counted and count.consumers < bound:\n",
        new="        if count.counted and count.consumers <= bound:\n",
        promise=SHUTDOWN,
        # Not test_acks_the_queue_applies_late_are_waited_for: whether the resumed leader
        # counts our consumer while the channel still holds settles back is a race (it killed
        # this mutant in 4 of 8 runs with --each, before and after its resume was timed on the
        # node). The unit test sits on the bound.
        tests=("tests/unit/test_queue_count.py::test_consumers_below_its_bound_and_only_below_it",),
    ),
    Mutant(
        name="last-acks-waited-for-past-their-bound",
        path="consumer/last_acks.py",
        old="        if not await consumers_below(declare, before, LAST_ACKS_WAIT_S):\n",
        new="        if not await consumers_below(declare, before, 3600.0):\n",
        promise=SHUTDOWN,
        tests=(T_LEAN + "test_the_close_waits_for_the_last_acks_no_longer_than_its_bound",),
        fast=True,
    ),
    Mutant(
        name="stall-measured-over-a-quiet-queue",
        path="tests/cluster/failover_support.py",
        old="            if until_rows is not None and v >= until_rows:\n                break\n",
        new="",
        promise=NODE_LOSS,
        tests=(
            "tests/unit/test_commit_watch.py::"
            "test_bounded_by_the_rows_that_waited_only_the_real_stall_counts",
            "tests/cluster/test_broker_failover.py::"
            "test_two_recorders_survive_the_loss_of_two_quorum_leaders",
        ),
    ),
    Mutant(
        name="replay-by-reason-moves-every-reason",
        path="consumer/tools/dlq.py",
        old="    done = Pass(_every if reason is None else _of_group(reason), plan=planned)\n",
        new="    done = Pass(_every)\n",
        promise=DLQ_BY_REASON,
        tests=(T_BY_REASON + "test_mixed_dlq_worked_by_reason",),
    ),
    Mutant(
        name="discard-without-its-reason-filter",
        # the survey shows (and so plans) every reason: the pass takes what it was shown
        path="consumer/tools/dlq.py",
        old="    wanted = _every if reason is None else _of_group(reason)\n",
        new="    wanted = _every\n",
        promise=DLQ_BY_REASON,
        tests=(
            T_BY_REASON + "test_mixed_dlq_worked_by_reason",
            T_BY_REASON + "test_cli_dlq_by_reason",
        ),
    ),
    Mutant(
        name="discard-without-asking",
        path="consumer/tools/dlq.py",
        old="    if not await asyncio.to_thread(confirm, question):\n",
        new="    if False:\n",
        promise=DLQ_BY_REASON,
        tests=(
            T_BY_REASON + "test_mixed_dlq_worked_by_reason",
            T_BY_REASON + "test_cli_dlq_by_reason",
        ),
    ),
    Mutant(
        name="dry-run-moves",
        path="consumer/tools/dlq.py",
        old='            print("dry run: nothing moved", file=out)\n'
        "            return 0 if in_order else 1\n",
        new='            print("dry run: nothing moved", file=out)\n',
        promise=DLQ_BY_REASON,
        tests=(
            T_BY_REASON + "test_mixed_dlq_worked_by_reason",
            T_BY_REASON + "test_cli_dlq_by_reason",
        ),
    ),
    Mutant(
        name="replay-acks-before-the-confirm",
        # the ack first: a replay interrupted between the two loses the message
        path="consumer/tools/dlq.py",
        old="            await exchange.publish(body, routing_key=routing_key, mandatory=True)\n"
        "            await message.ack()\n",
        new="            await message.ack()\n"
        "            await exchange.publish(body, routing_key=routing_key, mandatory=True)\n",
        promise=DLQ_BY_REASON,
        tests=(T_DLQ + "test_interrupted_replay_may_duplicate_but_never_loses",),
    ),
    Mutant(
        name="replay-drops-the-message-id",
        path="consumer/tools/dlq.py",
        old="        message_id=message.message_id,\n",
        new="",
        promise=DLQ_BY_REASON,
        tests=(T_DLQ + "test_replay_moves_back_with_routing_key_type_and_clean_headers",),
        fast=True,
    ),
    Mutant(
        name="kept-messages-nacked-back-in-a-burst",
        # no wait before each batch of nacks (nor its round trip): the quorum queue's channel
        # reorders what it holds back
        path="consumer/tools/dlq_pass.py",
        old="                waiting = await self._paced(channel, len(tags) - start, waiting)\n",
        new="",
        promise=DLQ_BY_REASON,
        tests=(T_DLQ + "test_inspect_leaves_the_dlq_in_its_order",),
        fast=True,
    ),
    Mutant(
        name="dead-letter-time-not-stamped",
        path="consumer/delivery.py",
        old="        headers[DEAD_LETTERED_AT_HEADER] = _now()\n",
        new="",
        promise=DLQ_BY_REASON,
        tests=(T_BY_REASON + "test_mixed_dlq_worked_by_reason",),
    ),
    Mutant(
        name="content-encoding-ignored",
        path="consumer/app.py",
        old="            if properties.content_encoding:",
        new="            if False:",
        promise=OTHER_CLIENTS,
        tests=(
            T_CLIENTS + "test_pika_content_encoding_and_content_type",
            T_CLIENTS + "test_node_amqplib_with_its_default_properties",
        ),
        fast=True,
    ),
    Mutant(
        name="kept-messages-nacked-back-in-one-nack",
        # one nack(multiple) for them all: over 32 messages, a quorum queue returns them in an
        # order of its own
        path="consumer/tools/dlq_pass.py",
        old="GIVE_BACK_CHUNK = 16\n",
        new="GIVE_BACK_CHUNK = 100_000\n",
        promise=DLQ_BY_REASON,
        tests=(T_DLQ + "test_inspect_leaves_the_dlq_in_its_order",),
        fast=True,
    ),
    Mutant(
        name="attempt-without-plus-one",
        path="bulk_recorder/recorder/flusher.py",
        old="[d.delivery_count + 1 for d in deliveries]",
        new="[d.delivery_count for d in deliveries]",
        promise=MEASURED,
        tests=(
            "tests/unit/test_settle_measures.py::"
            "test_holds_count_from_receipt_and_attempts_are_the_delivery_count_plus_one",
            "tests/faults/test_tune_measured.py::"
            "test_tune_reports_the_attempts_and_holds_a_real_recorder_went_through",
        ),
        fast=True,
    ),
    Mutant(
        name="hold-from-flush-start",
        path="bulk_recorder/recorder/flusher.py",
        old="        outcome = _Outcome()\n",
        new=(
            "        for p in live:\n"
            "            p.delivery.received = time.monotonic()\n"
            "        outcome = _Outcome()\n"
        ),
        promise=MEASURED,
        tests=(
            "tests/unit/test_settle_measures.py::"
            "test_holds_count_from_receipt_and_attempts_are_the_delivery_count_plus_one",
        ),
        fast=True,
    ),
    Mutant(
        name="released-holds-unmeasured",
        path="bulk_recorder/recorder/flusher.py",
        old="release_all([p.delivery for p in released], metrics)",
        new="release_all([p.delivery for p in released])",
        promise=MEASURED,
        tests=(T_PROPERTY + "test_flusher_acks_exactly_the_committed_deliveries",),
    ),
    Mutant(
        name="delivery-limit-in-force-not-exported",
        path="consumer/app.py",
        old="        self.metrics.delivery_limit.set(settings.rabbitmq_delivery_limit)\n",
        new="",
        promise=MEASURED,
        tests=(
            "tests/faults/test_tune_measured.py::"
            "test_tune_reports_the_attempts_and_holds_a_real_recorder_went_through",
        ),
    ),
    Mutant(
        name="limit-reached-by-valid-records-not-warned",
        path="consumer/tools/tune_advice.py",
        old="needed > m.delivery_limit",
        new="needed > m.delivery_limit + 1",
        promise=MEASURED,
        tests=(
            "tests/unit/test_tune_advice.py::"
            "test_a_limit_reached_by_valid_records_warns_and_recommends_two_more",
        ),
        fast=True,
    ),
    Mutant(
        name="held-never-settled",
        path="bulk_recorder/recorder/flusher.py",
        old="    metrics.held.settled(deliveries)\n",
        new="",
        promise=MEASURED,
        tests=(
            "tests/unit/test_settle_measures.py::"
            "test_holds_count_from_receipt_and_attempts_are_the_delivery_count_plus_one",
            "tests/faults/test_tune_measured.py::"
            "test_tune_reports_the_attempts_and_holds_a_real_recorder_went_through",
        ),
        fast=True,
    ),
    Mutant(
        name="creditor-published-without-its-not-blank-rule",
        path="bulk_recorder/records/schema.py",
        old='extra_json_schema=published.override({"pattern": published.NOT_BLANK_TEXT})',
        new='extra_json_schema=published.override({"pattern": published.TEXT})',
        promise=SPEC,
        tests=(
            "tests/unit/test_published_schema.py::"
            "test_a_job_the_document_allows_is_accepted_line_by_line",
        ),
    ),
    Mutant(
        name="traceparent-not-in-the-message-headers",
        path="bulk_recorder/producer/relay_batch.py",
        old="        headers=headers,\n",
        new="        headers=None,\n",
        promise=TRACED,
        tests=(T_TRACE,),
    ),
    Mutant(
        name="outbox-trace-context-not-stored",
        path="bulk_recorder/producer/outbox.py",
        old="traceparent, tracestate = current_carrier()",
        new="traceparent, tracestate = None, None",
        promise=TRACED,
        tests=(T_TRACE,),
    ),
    Mutant(
        name="job-lines-trace-context-not-stored",
        path="bulk_recorder/producer/job_staging.py",
        old="await self._conn.execute(_PUBLISH, job_id, *current_carrier())",
        new="await self._conn.execute(_PUBLISH, job_id, None, None)",
        promise=TRACED,
        tests=(T_TRACE,),
    ),
    Mutant(
        name="flush-span-without-links",
        path="bulk_recorder/recorder/flush_tracing.py",
        old="            span.add_link(context)\n",
        new="            pass\n",
        promise=TRACED,
        tests=(T_TRACE,),
    ),
    Mutant(
        name="flush-links-uncapped",
        path="bulk_recorder/infra/tracing.py",
        old="        if len(links) < limit:\n",
        new="        if True:\n",
        promise=TRACED,
        tests=("tests/unit/test_tracing.py::test_links_are_capped_and_the_rest_counted",),
        fast=True,
    ),
    Mutant(
        name="wrongly-typed-traceparent-extracted",
        path="bulk_recorder/infra/tracing.py",
        old="    if not isinstance(parent, str) or len(parent) > MAX_TRACEPARENT_CHARS:\n",
        new=(
            "    if isinstance(parent, bytes | bytearray):\n"
            "        parent = parent.decode()\n"
            "    if not isinstance(parent, str) or len(parent) > MAX_TRACEPARENT_CHARS:\n"
        ),
        promise=TRACED,
        tests=(
            "tests/unit/test_tracing.py::"
            "test_missing_malformed_or_wrongly_typed_headers_give_no_context",
        ),
        fast=True,
    ),
    # issue 27 (dlq): a discard or replay acts on exactly the messages it showed, found by
    # fingerprint, whatever is dead-lettered meanwhile; arrivals go back behind; a give back
    # another reader starves waits GIVE_BACK_WAIT_S at most in all
    Mutant(
        name="discard-past-what-it-showed",
        # the plan dropped: the discard takes the whole group, newcomers never shown included
        path="consumer/tools/dlq.py",
        old="    done = Pass(_of_group(reason), plan=planned)\n",
        new="    done = Pass(_of_group(reason))\n",
        promise=DLQ_BY_REASON,
        tests=(
            T_ARRIVALS + "test_discard_removes_exactly_the_messages_it_showed_while_others_arrive",
        ),
    ),
    Mutant(
        name="replay-limit-counts-instead-of-identifying",
        path="consumer/tools/dlq.py",
        old="    done = Pass(_every if reason is None else _of_group(reason), plan=planned)\n",
        new="    done = Pass(_every if reason is None else _of_group(reason))\n",
        promise=DLQ_BY_REASON,
        tests=(T_ARRIVALS + "test_replay_by_reason_with_a_limit_moves_exactly_the_ones_it_showed",),
    ),
    Mutant(
        name="fingerprint-of-nothing",
        # every message has one fingerprint: identity becomes a count again
        path="consumer/tools/dlq_identity.py",
        old="    return digest.digest()\n",
        new='    return b""\n',
        promise=DLQ_BY_REASON,
        tests=(
            T_ARRIVALS + "test_discard_removes_exactly_the_messages_it_showed_while_others_arrive",
        ),
    ),
    Mutant(
        name="fingerprint-with-the-read-count",
        # the broker's read count in the digest: no message is the one shown a read earlier
        path="consumer/tools/dlq_identity.py",
        old="if k != READ_COUNT_HEADER}",
        new="if k}",
        promise=DLQ_BY_REASON,
        tests=(
            T_ARRIVALS + "test_discard_removes_exactly_the_messages_it_showed_while_others_arrive",
        ),
    ),
    Mutant(
        name="plan-not-spent",
        # a fingerprint taken as often as it comes: both copies of a message shown once go
        path="consumer/tools/dlq_identity.py",
        old="        self._left[key] -= 1\n",
        new="        pass\n",
        promise=DLQ_BY_REASON,
        tests=(
            T_ARRIVALS + "test_discard_removes_exactly_the_messages_it_showed_while_others_arrive",
        ),
    ),
    Mutant(
        name="arrivals-not-held",
        # what arrived while a pass read is not read: the kept go back behind it
        path="consumer/tools/dlq_pass.py",
        old="    while held < most and loop.time() < deadline:\n",
        new="    while False:\n",
        promise=DLQ_BY_REASON,
        tests=(T_ARRIVALS + "test_inspect_and_dry_run_keep_the_order_while_others_arrive",),
    ),
    Mutant(
        name="give-back-waits-every-batch",
        # a starved give back keeps waiting GIVE_BACK_WAIT_S per batch of 16
        path="consumer/tools/dlq_pass.py",
        old='        log.warning("another client reads the DLQ; its order is not assured")\n'
        "        return False\n",
        new='        log.warning("another client reads the DLQ; its order is not assured")\n'
        "        return True\n",
        promise=DLQ_BY_REASON,
        tests=(
            T_ARRIVALS
            + "test_inspect_gives_back_within_its_bound_while_another_client_reads_the_dlq",
            T_GIVE_BACK_WAIT + "test_once_a_wait_ends_unmet_the_rest_go_back_without_waiting",
        ),
    ),
    Mutant(
        name="give-back-wait-ignores-a-rise",
        # another client's gets raise the count: the give back waits on to its deadline
        path="consumer/tools/dlq_pass.py",
        old="(count is not None and last is not None and count > last) or (",
        new="False or (",
        promise=DLQ_BY_REASON,
        tests=(T_GIVE_BACK_WAIT + "test_a_count_that_rises_ends_the_wait_unmet_at_once",),
    ),
    Mutant(
        name="give-back-wait-takes-a-repeat-for-a-rise",
        # the same count polled twice (the broker not done yet) ends the wait unmet
        path="consumer/tools/dlq_pass.py",
        old="last is not None and count > last)",
        new="last is not None and count >= last)",
        promise=DLQ_BY_REASON,
        tests=(T_GIVE_BACK_WAIT + "test_the_same_count_again_is_no_rise",),
    ),
    Mutant(
        name="give-back-paced-by-the-ready-count",
        # the waits read the ready count, which dead letters arriving raise too: on a broker
        # slow to apply, batches pile up unapplied and come back reordered
        path="consumer/tools/dlq_pass.py",
        old="        return count.consumers if count.counted else None\n",
        new="        return count.ready if count.counted else None\n",
        promise=DLQ_BY_REASON,
        tests=(T_PACE + "test_a_flood_on_a_broker_held_to_its_quota_keeps_the_dlq_in_its_order",),
    ),
    Mutant(
        name="give-back-runs-two-batches-ahead",
        # a wait lets two batches more go unapplied: 48 returns, past the channel's 32
        path="consumer/tools/dlq_pass.py",
        old=" is None or count > left:\n",
        new=" is None or count > left + 32:\n",
        promise=DLQ_BY_REASON,
        tests=(T_PACE + "test_a_flood_on_a_broker_held_to_its_quota_keeps_the_dlq_in_its_order",),
    ),
    Mutant(
        name="give-back-first-batch-unwaited",
        # the first batch goes before a pass's acks are applied: past 32 unapplied, the
        # channel stashes it with them and sends it in an order of its own
        path="consumer/tools/dlq_pass.py",
        old="                waiting = await self._paced(",
        new="                waiting = start == 0 or await self._paced(",
        promise=DLQ_BY_REASON,
        tests=(T_PACE + "test_acks_unapplied_as_a_give_back_starts_keep_the_dlq_in_its_order",),
    ),
    Mutant(
        name="fingerprint-depends-on-header-order",
        # the same headers written in another order: a shown message no longer found
        path="consumer/tools/dlq_identity.py",
        old="        items = sorted((str(k), _canonical(v)) for k, v in value.items())\n",
        new="        items = [(str(k), _canonical(v)) for k, v in value.items()]\n",
        promise=DLQ_BY_REASON,
        tests=(
            "tests/unit/test_dlq_identity.py::"
            "test_the_read_count_and_the_order_of_header_keys_do_not_change_a_fingerprint",
        ),
        fast=True,
    ),
    # issue 29 (monitoring): standard metrics, the DLQ's depth, alerts and a dashboard that keep
    # environments apart, runbooks, and the PrometheusRule generated from the alert rules.
    Mutant(
        name="created-series-exported",
        path="bulk_recorder/infra/metrics.py",
        old="        disable_created_metrics()  # type: ignore[no-untyped-call]\n",
        new="",
        promise="Operable",
        tests=(
            "tests/integration/test_standard_metrics.py::"
            "test_a_running_role_serves_the_standard_collectors_build_info_and_no_created_series",
        ),
    ),
    Mutant(
        name="process-collector-not-registered",
        path="bulk_recorder/infra/metrics.py",
        old="        ProcessCollector(registry=r)  # process_*",
        new="        ProcessCollector  # process_*",
        promise="Operable",
        tests=(
            "tests/integration/test_standard_metrics.py::"
            "test_a_running_role_serves_the_standard_collectors_build_info_and_no_created_series",
        ),
    ),
    Mutant(
        name="build-info-without-the-version",
        path="bulk_recorder/infra/metrics.py",
        old="            version=bulk_recorder.__version__,\n",
        new='            version="",\n',
        promise="Operable",
        tests=(
            "tests/integration/test_standard_metrics.py::"
            "test_a_running_role_serves_the_standard_collectors_build_info_and_no_created_series",
        ),
    ),
    Mutant(
        name="dead-letter-reasons-not-initialised",
        path="bulk_recorder/infra/metrics.py",
        old="            self.messages_dead_lettered.labels(reason=reason)\n",
        new="            pass\n",
        promise="Operable",
        tests=(
            "tests/integration/test_standard_metrics.py::"
            "test_a_running_role_serves_the_standard_collectors_build_info_and_no_created_series",
        ),
    ),
    Mutant(
        name="publish-failure-reasons-not-initialised",
        path="bulk_recorder/infra/metrics.py",
        old="            self.outbox_publish_failures.labels(reason=reason)\n",
        new="            pass\n",
        promise="Operable",
        tests=(
            "tests/integration/test_standard_metrics.py::"
            "test_a_running_role_serves_the_standard_collectors_build_info_and_no_created_series",
        ),
    ),
    Mutant(
        name="openmetrics-never-negotiated",
        path="bulk_recorder/infra/metrics.py",
        old="    encoder, content_type = choose_encoder(accept)\n",
        new='    encoder, content_type = choose_encoder("")\n',
        promise="Operable",
        tests=(
            "tests/integration/test_standard_metrics.py::"
            "test_a_running_role_negotiates_openmetrics_and_gzip_as_prometheus_asks",
        ),
    ),
    Mutant(
        name="metrics-never-gzipped",
        path="bulk_recorder/infra/metrics.py",
        old="    if wants_gzip and len(body) >= _GZIP_MIN_BYTES:\n",
        new="    if False:\n",
        promise="Operable",
        tests=(
            "tests/integration/test_standard_metrics.py::"
            "test_a_running_role_negotiates_openmetrics_and_gzip_as_prometheus_asks",
        ),
    ),
    Mutant(
        name="dlq-depth-not-read",
        path="consumer/queue_watch.py",
        old="        dead_letters, _ = await self._count(connection, self.dlq)\n",
        new="        dead_letters = 0\n",
        promise="Operable",
        tests=(
            "tests/integration/test_queue_watch.py::"
            "test_the_dlq_depth_counts_every_dead_letter_the_recorder_did_not_count_too",
        ),
    ),
    alert_rule(
        name="alert-consumers-across-namespaces",
        old='max by (cluster, namespace) (bulk_recorder_queue_consumers{service="bulk-recorder", ',
        new='max(bulk_recorder_queue_consumers{service="bulk-recorder", ',
    ),
    Mutant(
        name="dashboard-query-ignores-the-namespace",
        path="deploy/grafana/dashboards/bulk-recorder.json",
        old='"expr": "up{service=\\"bulk-recorder\\", namespace=~\\"$namespace\\", job=~\\"$job\\"',
        new='"expr": "up{service=\\"bulk-recorder\\", job=~\\"$job\\"',
        promise="Operable",
        tests=(
            "tests/ops/test_dashboard.py::"
            "test_every_query_filters_by_namespace_and_job_and_keeps_namespaces_apart",
        ),
        fast=True,
    ),
    Mutant(
        name="runbook-section-missing",
        path="docs/operations.md",
        old="### QueueNotConsumed\n",
        new="### When the queue is not consumed\n",
        promise="Operable",
        tests=(
            "tests/ops/test_alerts.py::"
            "test_every_runbook_url_leads_to_a_section_of_the_published_operations_guide",
        ),
        fast=True,
    ),
    Mutant(
        name="prometheus-rule-not-regenerated",
        path="deploy/prometheus/alerts.yml",
        old='job="recorder"} == 1\n        for: 1m',
        new='job="recorder"} == 1\n        for: 2m',
        promise="Operable",
        tests=(
            "tests/ops/test_kubernetes.py::"
            "test_the_prometheus_rule_is_generated_from_the_alert_rules_and_rendered",
        ),
        fast=True,
    ),
    # issue 27 (logsafe): passwords masked in every form, *_FILE secrets that are not UTF-8,
    # trace headers bounded before they are parsed, every log line escaped and cut
    Mutant(
        name="secret-file-not-utf8-uncaught",
        path="settings.py",
        old="        except (OSError, UnicodeDecodeError) as exc:\n",
        new="        except OSError as exc:\n",
        promise=BAD_SETTINGS,
        tests=(
            "tests/unit/test_secret_files.py::"
            "test_a_secret_file_that_is_not_utf8_is_exit_2_and_one_line_naming_it",
        ),
        fast=True,
    ),
    Mutant(
        name="secret-file-with-nuls-echoed",
        path="settings.py",
        old="        if any(ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0 for char in value):\n",
        new="        if False:\n",
        promise=BAD_SETTINGS,
        tests=(
            "tests/unit/test_secret_files.py::"
            "test_an_ascii_utf16_file_without_bom_is_refused_not_echoed",
        ),
        fast=True,
    ),
    Mutant(
        name="password-ends-at-the-first-at",
        path="bulk_recorder/masking.py",
        old='    at = text.rfind("@", rest, end)\n',
        new='    at = text.find("@", rest, end)\n',
        promise=LOGS,
        tests=("tests/unit/test_masking.py::test_masked_hides_every_form_of_password",),
        fast=True,
    ),
    Mutant(
        name="query-string-password-shown",
        path="bulk_recorder/masking.py",
        old="        if equals and is_secret_name(unquote_plus(name)):\n",
        new="        if False:\n",
        promise=LOGS,
        tests=(
            "tests/unit/test_masking.py::test_masked_hides_every_form_of_password",
            "tests/integration/test_log_safety.py::"
            "test_migrate_never_prints_a_password_from_database_url_file",
        ),
        fast=True,
    ),
    Mutant(
        name="settings-error-unmasked",
        path="settings.py",
        old="""            problems.append(masked(f"{name}: {error['msg']}{shown}"))\n""",
        new="""            problems.append(f"{name}: {error['msg']}{shown}")\n""",
        promise=BAD_SETTINGS,
        tests=("tests/unit/test_masking.py::test_a_settings_error_never_shows_the_password",),
        fast=True,
    ),
    Mutant(
        name="tracestate-parsed-unbounded",
        path="bulk_recorder/infra/tracing.py",
        old="    state = bounded_tracestate(state) if isinstance(state, str) else None\n",
        new="    state = state if isinstance(state, str) else None\n",
        promise=LOGS,
        tests=(
            "tests/unit/test_trace_headers.py::"
            "test_a_tracestate_is_cut_to_32_members_and_512_characters",
        ),
        fast=True,
    ),
    Mutant(
        name="opentelemetry-member-warnings-logged",
        path="bulk_recorder/infra/logs.py",
        old='                "opentelemetry.trace.span": {"level": "ERROR"},\n',
        new="",
        promise=LOGS,
        tests=(
            "tests/unit/test_trace_headers.py::"
            "test_opentelemetrys_member_warnings_stay_out_of_the_log",
        ),
        fast=True,
    ),
    Mutant(
        name="text-log-line-not-escaped",
        path="bulk_recorder/infra/logs.py",
        old="        record.message = escaped(rendered(record))\n",
        new="        record.message = rendered(record)\n",
        promise=LOGS,
        tests=(
            "tests/integration/test_log_safety.py::"
            "test_hostile_trace_headers_and_paths_neither_forge_nor_grow_the_api_log",
        ),
    ),
    Mutant(
        name="logged-value-from-outside-uncut",
        path="bulk_recorder/infra/logs.py",
        old="short = tuple(shown(a, MAX_ARG_CHARS) if isinstance(a, str) else a for a in args)\n",
        new="short = args\n",
        promise=LOGS,
        tests=(
            "tests/integration/test_log_safety.py::"
            "test_hostile_trace_headers_and_paths_neither_forge_nor_grow_the_api_log",
            "tests/unit/test_log_cuts.py::test_an_argument_of_512_characters_is_whole_and_of_513_cut",
        ),
    ),
    Mutant(
        name="json-log-line-split-by-u2028",
        path="bulk_recorder/infra/logs.py",
        old='        return _JSON_RAW.sub(lambda m: f"\\\\u{ord(m[0]):04x}", line)\n',
        new="        return line\n",
        promise=LOGS,
        tests=("tests/unit/test_log_lines.py::test_a_json_line_is_one_object_whatever_the_break",),
        fast=True,
    ),
    Mutant(
        name="traceback-message-not-escaped",
        path="bulk_recorder/infra/logs.py",
        old="    return escaped(shown(text, MAX_MESSAGE_CHARS))\n",
        new="    return shown(text, MAX_MESSAGE_CHARS)\n",
        promise=LOGS,
        tests=(
            "tests/unit/test_log_lines.py::"
            "test_an_exceptions_message_cannot_add_a_line_to_the_traceback",
        ),
        fast=True,
    ),
    Mutant(
        name="endpoint-shows-a-password-holding-a-slash",
        path="bulk_recorder/masking.py",
        old="    parts = urlsplit(masked(url))\n",
        new="    parts = urlsplit(url)\n",
        promise=LOGS,
        tests=("tests/unit/test_masking.py::test_endpoint_names_host_and_path_only",),
        fast=True,
    ),
    Mutant(
        name="tracing-start-up-line-unmasked",
        path="bulk_recorder/infra/tracing.py",
        old="        masked(url),  # never a password in a log line\n",
        new="        url,\n",
        promise=LOGS,
        tests=(
            "tests/unit/test_masking.py::"
            "test_the_tracing_start_up_line_masks_the_endpoints_secrets",
        ),
        fast=True,
    ),
    # issue 27 (health): the health check knows every documented start, checks liveness and
    # imports no driver; /readyz names a task that is down and forgets a cancel once consuming;
    # unpark zeroes attempts; tune warns below its own consumer timeout.
    Mutant(
        name="healthcheck-misses-python-m-consumer",
        path="consumer/healthcheck.py",
        old='_MODULE_ROLES = {"consumer": "consume"}',
        new="_MODULE_ROLES: dict[str, str] = {}",
        promise=HEALTH,
        tests=(
            T_HEALTH + "test_healthcheck_is_healthy_for_every_documented_way_to_start_a_role",
            "tests/unit/test_healthcheck_role.py::"
            "test_find_role_finds_a_recorder_started_as_python_m_consumer",
        ),
        fast=True,
    ),
    Mutant(
        name="healthcheck-probes-readiness",
        path="consumer/healthcheck.py",
        old='path = "/readyz" if ready else "/healthz"',
        new='path = "/readyz"',
        promise=HEALTH,
        tests=(T_HEALTH + "test_healthcheck_is_healthy_while_the_role_is_alive_but_not_ready",),
    ),
    Mutant(
        name="healthcheck-imports-the-whole-cli",
        path="consumer/cli.py",
        old="from consumer import healthcheck\n",
        new="from consumer import healthcheck\nfrom consumer.producer import cmd_api as _eager\n",
        promise=HEALTH,
        tests=(
            "tests/unit/test_healthcheck_cost.py::"
            "test_the_healthcheck_and_help_import_no_driver_tracing_or_settings_library",
        ),
        fast=True,
    ),
    Mutant(
        name="readyz-ignores-a-supervised-task-down",
        path="consumer/app.py",
        old="self._db_ok and workers_ok and not down, detail",
        new="self._db_ok and workers_ok, detail",
        promise=BROKER_LOSS,
        tests=(
            T_READY + "test_readyz_is_503_and_names_a_supervised_task_that_is_down_while_the_"
            "services_are_up",
        ),
    ),
    Mutant(
        name="supervisor-reports-a-raised-task-running",
        path="bulk_recorder/infra/supervisor.py",
        old="if task.done() and not (self._starters[name][1] and _returned(task))",
        new="if task.done() and task.cancelled()",
        promise=BROKER_LOSS,
        tests=(
            T_READY + "test_readyz_is_503_and_names_a_supervised_task_that_is_down_while_the_"
            "services_are_up",
        ),
    ),
    Mutant(
        name="cancelled-consumer-note-kept",
        path="consumer/consuming.py",
        old="        self.ok = True\n        self.cancelled_note = None\n",
        new="        self.ok = True\n",
        promise=BROKER_LOSS,
        tests=(T_READY + "test_readyz_drops_the_cancelled_consumer_once_it_consumes_again",),
    ),
    Mutant(
        name="unpark-keeps-the-attempts",
        path="consumer/tools/outbox.py",
        old="SET parked_at = NULL, attempts = 0, available_at",
        new="SET parked_at = NULL, available_at",
        promise=PRODUCER,
        tests=(
            "tests/integration/test_outbox_unpark.py::"
            "test_a_row_put_back_gets_the_full_backoff_again_not_parked_at_its_first_refusal",
        ),
        fast=True,
    ),
    Mutant(
        name="job-completed-before-the-relay-counted-it",
        path="bulk_recorder/producer/api/job_status.py",
        old="WHERE id = $1 AND completed_at IS NULL AND published + dead_lettered >= accepted",
        new="WHERE id = $1 AND completed_at IS NULL",
        promise=PRODUCER,
        tests=(
            "tests/integration/test_job_progress.py::"
            "test_a_job_recorded_before_the_relay_counted_its_rows_is_not_yet_completed",
        ),
        fast=True,
    ),
    Mutant(
        name="unread-account-index-kept",
        path="bulk_recorder/sql/011_unread_indexes.sql",
        old="DROP INDEX IF EXISTS operations_account_idx;",
        new="SELECT 1;",
        promise=INDEXES,
        tests=(
            "tests/integration/test_indexes.py::"
            "test_the_recorders_tables_hold_exactly_the_indexes_the_docs_name",
        ),
        fast=True,
    ),
    Mutant(
        name="tune-timeout-headroom-unwarned",
        path="consumer/tools/tune_advice.py",
        old="elif 2 * worst + HEADROOM_S > timeout:",
        new="elif 2 * worst > timeout:",
        promise=MEASURED,
        tests=(
            "tests/unit/test_tune_advice.py::"
            "test_a_consumer_timeout_below_twice_the_worst_hold_plus_the_headroom_warns",
        ),
        fast=True,
    ),
    Mutant(
        name="refused-row-dead-lettered-a-delivery-early",
        path="bulk_recorder/recorder/flusher.py",
        old="if delivery.delivery_count >= self._delivery_limit:",
        new="if delivery.delivery_count + 1 >= self._delivery_limit:",
        promise=REFUSED_ROW,
        tests=(
            "tests/integration/test_delivery_limit.py::"
            "test_a_refused_row_is_dead_lettered_with_its_reason_on_the_brokers_last_delivery",
        ),
        fast=True,
    ),
    # issue 29 (shutdown): one stop budget per role; the steps after the first take what is left
    Mutant(
        name="stop-budget-copies-past-their-confirm",
        path="bulk_recorder/infra/stop_budget.py",
        old="        copies = min(settings.bulk_recorder_confirm_timeout_s, FINAL_COPIES_S)\n",
        new="        copies = max(settings.bulk_recorder_confirm_timeout_s, FINAL_COPIES_S)\n",
        promise=SHUTDOWN,
        tests=(
            "tests/unit/test_stop_budget.py::test_the_recorder_budget_is_flush_then_copies_then_close",
            "tests/ops/test_kubernetes.py::test_the_grace_period_follows_from_the_stop_budget",
        ),
        fast=True,
    ),
    Mutant(
        name="stop-basic-cancel-unbounded",
        path="consumer/app.py",
        old='            async with asyncio.timeout(deadline.left_for("flush")):\n',
        new="            async with asyncio.timeout(None):\n",
        promise=SHUTDOWN,
        tests=(
            "tests/faults/test_stop_budget.py::"
            "test_recorder_stops_within_its_budget_with_broker_and_database_held",
        ),
    ),
    Mutant(
        name="relay-stop-lanes-own-bound",
        path="bulk_recorder/producer/relay.py",
        old='timeout=deadline.left_for("batches"))',
        new="timeout=c.publish_timeout_s + 5)",
        promise=SHUTDOWN,
        tests=(
            "tests/faults/test_stop_budget.py::"
            "test_relay_stops_within_its_budget_with_broker_and_database_held",
        ),
    ),
    Mutant(
        name="api-stop-pool-own-bound",
        path="bulk_recorder/producer/api/app.py",
        old="            await asyncio.wait_for(pool.close(), deadline.left())\n",
        new="            await asyncio.wait_for(pool.close(), 10)\n",
        promise=SHUTDOWN,
        tests=(
            "tests/faults/test_stop_budget.py::"
            "test_api_stops_within_its_budget_with_the_database_held",
        ),
    ),
    Mutant(
        name="otel-grpc-protocol-ignored",
        path="bulk_recorder/otel_settings.py",
        old="        if value != PROTOCOL:\n",
        new="        if False:\n",
        promise=BAD_SETTINGS,
        tests=(
            "tests/unit/test_otel_settings.py::test_what_the_sdk_here_cannot_do_is_refused_by_name",
        ),
        fast=True,
    ),
    Mutant(
        name="aiormq-connect-errors-logged",
        path="bulk_recorder/infra/logs.py",
        old="    quiet_aiormq_connect_errors()\n",
        new="    pass\n",
        promise=BROKER_LOSS,
        tests=(
            "tests/faults/test_outage_log_lines.py::test_a_refused_broker_is_one_warning_per_connection_and_no_error",
        ),
    ),
    Mutant(
        name="outage-warning-every-retry",
        path="bulk_recorder/infra/reconnect.py",
        old="        if self._failures == 0:\n",
        new="        if True:\n",
        promise=BROKER_LOSS,
        tests=(
            "tests/faults/test_outage_log_lines.py::test_a_refused_broker_is_one_warning_per_connection_and_no_error",
        ),
    ),
    Mutant(
        name="edited-migration-accepted",
        path="bulk_recorder/infra/migrate.py",
        old="        if kept is not None and kept != checksum(sql):\n",
        new="        if False:\n",
        promise=BAD_SETTINGS,
        tests=(
            "tests/integration/test_migration_checksums.py::"
            "test_an_edited_applied_migration_is_refused_naming_the_file",
        ),
        fast=True,
    ),
    Mutant(
        name="load-commands-reach-remote-hosts",
        path="consumer/tools/local_only.py",
        old="        if host and not _loopback(host):",
        new="        if False:",
        promise=BAD_SETTINGS,
        tests=(
            "tests/integration/test_cli_polish.py::"
            "test_the_load_commands_refuse_a_remote_broker_unless_allowed",
        ),
    ),
    Mutant(
        name="help-without-defaults",
        path="consumer/arguments.py",
        old='        return text + " (default: %(default)s)"\n',
        new="        return text\n",
        promise=BAD_SETTINGS,
        tests=("tests/unit/test_cli_help.py::test_every_option_has_help_and_shows_its_default",),
        fast=True,
    ),
    Mutant(
        name="relay-settings-ignored",
        path="consumer/producer.py",
        old="        return setting if option is None else option\n",
        new="        return 1 if option is None else option\n",
        promise=BAD_SETTINGS,
        tests=(
            "tests/unit/test_relay_settings.py::"
            "test_the_relay_settings_are_its_defaults_and_an_option_wins",
        ),
        fast=True,
    ),
    # issue 29 (k8s): manifests KEDA and upgrades do not fight, image, compose secrets, docs
    Mutant(
        name="k8s-recorder-replicas-under-keda",
        path="deploy/kubernetes/overlays/production/kustomization.yaml",
        old="replicas:\n  - name: relay\n",
        new="replicas:\n  - name: recorder\n    count: 3\n  - name: relay\n",
        promise="Operable",
        tests=(
            "tests/ops/test_kubernetes.py::test_no_deployment_that_keda_scales_carries_a_replica_count",
        ),
        fast=True,
    ),
    Mutant(
        name="k8s-keda-scales-down-at-once",
        path="deploy/kubernetes/components/keda/scaledobject.yaml",
        old="          stabilizationWindowSeconds: 300\n",
        new="          stabilizationWindowSeconds: 0\n",
        promise="Operable",
        tests=(
            "tests/ops/test_kubernetes.py::test_keda_scales_down_through_the_hpa_behavior_and_falls_back",
        ),
        fast=True,
    ),
    Mutant(
        name="k8s-keda-queue-not-from-settings",
        path="deploy/kubernetes/components/keda/kustomization.yaml",
        old="          kind: ScaledObject\n          name: recorder\n",
        new="          kind: ScaledObject\n          name: not-the-recorder\n",
        promise="Operable",
        tests=(
            "tests/ops/test_kubernetes.py::test_keda_follows_the_queue_the_recorders_consume",
            "tests/ops/test_kubernetes.py::test_keda_scales_the_recorder_on_its_queue",
        ),
        fast=True,
    ),
    # queue shards: KEDA, the alerts and the dashboard read every shard
    Mutant(
        name="k8s-keda-shard-trigger-reads-shard-one",
        path="deploy/kubernetes/components/keda-shards/scaledobject-triggers.yaml",
        old="        queueName: RABBITMQ_QUEUE.shard-2\n",
        new="        queueName: RABBITMQ_QUEUE\n",
        promise="Operable",
        tests=(
            "tests/ops/test_kubernetes.py::"
            "test_keda_with_queue_shards_reads_every_shard_the_settings_make",
        ),
        fast=True,
    ),
    Mutant(
        name="k8s-keda-shard-target-not-divided",
        path="deploy/kubernetes/components/keda-shards/scaledobject-triggers.yaml",
        old='queueName: RABBITMQ_QUEUE.shard-3\n        mode: QueueLength\n        value: "6667"',
        new='queueName: RABBITMQ_QUEUE.shard-3\n        mode: QueueLength\n        value: "20000"',
        promise="Operable",
        tests=(
            "tests/ops/test_kubernetes.py::"
            "test_keda_with_queue_shards_reads_every_shard_the_settings_make",
        ),
        fast=True,
    ),
    alert_rule(
        name="alert-shards-whole-queue-pairs-two-shards",
        old=(
            "            unless on (cluster, namespace)\n"
            "            max by (cluster, namespace) (bulk_recorder_shard_messages"
            '{service="bulk-recorder", job="recorder"})\n'
        ),
        new="",
    ),
    Mutant(
        name="dashboard-shard-panel-collapses-the-shards",
        path="deploy/grafana/dashboards/bulk-recorder.json",
        old="max by (cluster, namespace, queue) (bulk_recorder_shard_messages",
        new="max by (cluster, namespace) (bulk_recorder_shard_messages",
        promise="Operable",
        tests=(
            "tests/ops/test_dashboard.py::"
            "test_the_shard_panel_draws_each_shard_or_else_the_one_queue",
        ),
        fast=True,
    ),
    alert_rule(
        name="alert-shard-backlog-names-no-shard",
        old="max by (cluster, namespace, queue) (delta(",
        new="max by (cluster, namespace) (delta(",
    ),
    Mutant(
        name="k8s-migrate-job-fixed-name",
        path="deploy/kubernetes/overlays/production/kustomization.yaml",
        old="      - select:\n          kind: Job\n          name: migrate\n",
        new="      - select:\n          kind: Job\n          name: no-such-job\n",
        promise="Operable",
        tests=(
            "tests/ops/test_kubernetes.py::test_the_migrate_job_is_named_after_its_image_so_an_upgrade_applies",
        ),
        fast=True,
    ),
    Mutant(
        name="k8s-migrate-without-deadline",
        path="deploy/kubernetes/base/migrate.yaml",
        old="  activeDeadlineSeconds: 1800\n",
        new="",
        promise="Operable",
        tests=(
            "tests/ops/test_kubernetes.py::test_the_migrate_job_is_named_after_its_image_so_an_upgrade_applies",
        ),
        fast=True,
    ),
    Mutant(
        name="k8s-recorder-egress-to-any-port",
        path="deploy/kubernetes/base/recorder.yaml",
        old="    - ports:\n        - port: 5432\n          protocol: TCP\n",
        new="    - {}\n",
        promise="Operable",
        tests=(
            "tests/ops/test_kubernetes.py::test_each_role_talks_only_to_its_broker_database_and_dns",
        ),
        fast=True,
    ),
    Mutant(
        name="k8s-metrics-port-open-to-every-pod",
        path="deploy/kubernetes/base/recorder.yaml",
        old=(
            "      from:\n        - namespaceSelector: {}\n          podSelector:\n"
            "            matchLabels:\n              app.kubernetes.io/name: prometheus\n"
        ),
        new="",
        promise="Operable",
        tests=(
            "tests/ops/test_kubernetes.py::test_each_role_talks_only_to_its_broker_database_and_dns",
        ),
        fast=True,
    ),
    Mutant(
        name="k8s-roles-share-a-service-account",
        path="deploy/kubernetes/base/relay.yaml",
        old="      serviceAccountName: bulk-recorder-relay\n",
        new="      serviceAccountName: bulk-recorder-recorder\n",
        promise="Operable",
        tests=(
            "tests/ops/test_kubernetes.py::test_each_role_runs_as_its_own_service_account_without_a_token",
        ),
        fast=True,
    ),
    Mutant(
        name="k8s-recorder-memory-below-its-prefetch",
        path="deploy/kubernetes/base/recorder.yaml",
        old="              memory: 448Mi\n",
        new="              memory: 256Mi\n",
        promise="Operable",
        tests=(
            "tests/ops/test_kubernetes.py::test_the_recorders_memory_limit_covers_the_deliveries_it_may_hold",
        ),
        fast=True,
    ),
    Mutant(
        name="image-one-metrics-port-for-every-role",
        path="Dockerfile",
        old="    METRICS_HOST=0.0.0.0\n",
        new="    METRICS_HOST=0.0.0.0 \\\n    METRICS_PORT=9464\n",
        promise="Operable",
        tests=(
            "tests/ops/test_dockerfile.py::test_each_role_listens_on_its_own_documented_port_in_the_image",
        ),
        fast=True,
    ),
    Mutant(
        name="image-version-label-not-the-package",
        path="Dockerfile",
        old='org.opencontainers.image.version="${VERSION}"',
        new='org.opencontainers.image.version="latest"',
        promise="Operable",
        tests=(
            "tests/ops/test_dockerfile.py::test_the_image_carries_the_oci_labels_with_the_projects_version",
        ),
        fast=True,
    ),
    Mutant(
        name="image-runtime-base-floating",
        path="Dockerfile",
        old="FROM ${PYTHON_IMAGE} AS runtime\n",
        new="FROM python:3.11-slim AS runtime\n",
        promise="Operable",
        tests=("tests/ops/test_dockerfile.py::test_the_base_is_pinned_in_one_place",),
        fast=True,
    ),
    Mutant(
        name="compose-password-in-environment",
        path="docker-compose.yml",
        old="      POSTGRES_PASSWORD_FILE: /run/secrets/postgres-password\n",
        new="      POSTGRES_PASSWORD: ${POSTGRES_PASSWORD:-changeme}\n",
        promise="Operable",
        tests=(
            "tests/ops/test_compose.py::test_no_password_is_in_an_environment_variable",
            "tests/ops/test_compose.py::test_every_file_variable_names_a_secret_its_service_mounts",
        ),
        fast=True,
    ),
    Mutant(
        name="compose-api-reads-the-recorders-login",
        path="docker-compose.yml",
        old="      - {source: database-url-api, target: database-url}\n",
        new="      - {source: database-url-recorder, target: database-url}\n",
        promise="Operable",
        tests=(
            "tests/ops/test_compose.py::test_every_file_variable_names_a_secret_its_service_mounts",
        ),
        fast=True,
    ),
    Mutant(
        name="compose-secrets-readable-by-all",
        path="deploy/compose/secrets.sh",
        old='chmod 700 "$dir"\n',
        new='chmod 755 "$dir"\n',
        promise="Operable",
        tests=(
            "tests/ops/test_compose.py::test_the_secrets_agree_with_each_other_and_the_settings",
        ),
        fast=True,
    ),
    Mutant(
        name="compose-recorder-memory-below-its-prefetch",
        path="docker-compose.yml",
        old='limits: {cpus: "1", memory: 448M}',
        new='limits: {cpus: "1", memory: 256M}',
        promise="Operable",
        tests=(
            "tests/ops/test_compose.py::test_every_container_has_limits_and_the_recorders_memory_covers_what_it_may_hold",
        ),
        fast=True,
    ),
    Mutant(
        name="docs-results-cite-a-moved-module",
        path="benchmarks/RESULTS.md",
        old="(`keep_session` in `bulk_recorder/infra/db.py`;",
        new="(`keep_session` in `bulk_recorder/db.py`;",
        promise="Operable",
        tests=("tests/unit/test_docs_links.py::test_every_repository_path_a_page_cites_exists",),
        fast=True,
    ),
    Mutant(
        name="deploy-cites-a-readme-section-that-moved",
        path="deploy/kubernetes/base/recorder.yaml",
        old="Replicas need no coordination (docs/operations.md\n",
        new="Replicas need no coordination (README\n",
        promise="Operable",
        tests=(
            "tests/unit/test_docs_links.py::test_every_page_and_section_the_deploy_files_cite_exists",
        ),
        fast=True,
    ),
    # issue 27 (numbers): metadata numbers by numeric's digits, nesting through an operation,
    # a job line's amount as the recorder reads it, balances past 10^20, the intake's byte limits
    Mutant(
        name="metadata-scale-one-past-numeric",
        path="bulk_recorder/records/rules.py",
        old="    if exponent < -MAX_METADATA_FRACTION_DIGITS or",
        new="    if exponent < -MAX_METADATA_FRACTION_DIGITS - 1 or",
        promise=BAD_DATA,
        tests=(
            "tests/integration/test_metadata_numbers.py::"
            "test_metadata_number_accepted_exactly_when_postgresql_stores_it",
        ),
    ),
    Mutant(
        name="nesting-bound-first-pass-skips-unknown-fields",
        # The first pass refuses unknown fields so that only the metadata can nest deep; a
        # lenient first pass skips an unknown field's value unread, however deep it nests.
        path="bulk_recorder/records/validation.py",
        old="            wire = STRICT_DECODERS[record_type].decode(body)\n",
        new="            wire = BODY_DECODERS[record_type].decode(body)\n",
        promise=BAD_DATA,
        tests=(
            "tests/unit/test_records.py::test_nesting_inside_an_operation_counts_the_operation",
            "tests/unit/test_records.py::test_nesting_in_ignored_field_counts_too",
        ),
        fast=True,
    ),
    Mutant(
        name="inline-handler-raise-kills-the-reader",
        # Deliveries run in the channel's reader: a handler's exception let through ends the
        # reader and closes the channel, and every later delivery waits for a reconnect.
        path="bulk_recorder/infra/aiormq_internals.py",
        old="        try:\n            handle(message)\n        except Exception:\n"
        '            log.exception("Consumer callback failed")\n',
        new="        handle(message)\n",
        promise=BAD_DATA,
        tests=(
            "tests/integration/test_deliver_inline.py::"
            "test_inline_deliveries_arrive_in_order_on_the_reader_and_survive_a_raise",
        ),
        fast=True,
    ),
    Mutant(
        name="cpf-second-digit-misweighs-the-first",
        # The second DV weighs the first DV by 2: by 1, some valid CPFs are refused and some
        # wrong ones accepted.
        path="bulk_recorder/records/documents.py",
        old="_CPF_W2: Final[tuple[int, ...]] = (11, 10, 9, 8, 7, 6, 5, 4, 3, 2)\n",
        new="_CPF_W2: Final[tuple[int, ...]] = (11, 10, 9, 8, 7, 6, 5, 4, 3, 1)\n",
        promise=BAD_DATA,
        tests=(
            "tests/unit/test_documents.py::"
            "test_any_eleven_digits_pass_exactly_when_the_reference_digits_match",
        ),
        fast=True,
    ),
    Mutant(
        name="nesting-bound-one-past-the-metadata",
        # Metadata 32 levels deep (33 in the body) has 32 opening brackets: the bound's count
        # must send it to the walk.
        path="bulk_recorder/records/validation.py",
        old='    return metadata.count(b"{") + metadata.count(b"[") >= MAX_DEPTH\n',
        new='    return metadata.count(b"{") + metadata.count(b"[") > MAX_DEPTH\n',
        promise=BAD_DATA,
        tests=("tests/unit/test_records.py::test_nesting_too_deep",),
        fast=True,
    ),
    Mutant(
        name="job-amount-published-with-an-exponent",
        path="bulk_recorder/producer/ingest.py",
        old='            "amount": format(annotation.amount, "f"),\n',
        new='            "amount": str(annotation.amount),\n',
        promise=EXACT_AMOUNTS,
        tests=(T_API + "test_a_job_lines_amount_is_published_as_the_recorder_decodes_it",),
    ),
    Mutant(
        name="ndjson-bom-looked-for-in-the-first-chunk-only",
        path="bulk_recorder/producer/parsers.py",
        old=" and codecs.BOM_UTF8.startswith(chunk):\n",
        new=" and False:\n",
        promise=PRODUCER,
        tests=(
            "tests/unit/test_ingest.py::test_a_bom_split_across_chunks_is_dropped_as_in_one_chunk",
        ),
        fast=True,
    ),
    Mutant(
        name="csv-record-measured-in-characters",
        path="bulk_recorder/producer/csv_lines.py",
        old="                out.append((number, self._to_body(row, utf8_size(text))))\n",
        new="                out.append((number, self._to_body(row, len(text))))\n",
        promise=PRODUCER,
        tests=("tests/unit/test_ingest.py::test_the_csv_line_limit_counts_bytes_not_characters",),
        fast=True,
    ),
    Mutant(
        name="balances-capped-at-an-amounts-width",
        path="bulk_recorder/sql/008_balances_unbounded.sql",
        old="ALTER COLUMN available TYPE numeric;",
        new="ALTER COLUMN available TYPE numeric(38, 18);",
        promise=EXACT_AMOUNTS,
        tests=(T_BALANCES + "test_balances_hold_any_sum_of_allowed_amounts",),
    ),
    # issue 27 (hunt): a dead letter and its replay keep the message's properties
    Mutant(
        name="dead-letter-drops-reply-to",
        path="consumer/copy_properties.py",
        old="        reply_to=props.reply_to,\n",
        new="",
        promise=OTHER_CLIENTS,
        tests=(T_DLQ_PROPERTIES,),
    ),
    Mutant(
        name="dead-letter-forgets-the-user-id",
        path="consumer/copy_properties.py",
        old="        (ORIGINAL_USER_ID_HEADER, props.user_id),\n",
        new="",
        promise=OTHER_CLIENTS,
        tests=(T_DLQ_PROPERTIES,),
    ),
    Mutant(
        name="replay-drops-priority",
        path="consumer/tools/dlq.py",
        old="        priority=message.priority,\n",
        new="",
        promise=OTHER_CLIENTS,
        tests=(T_DLQ_PROPERTIES,),
    ),
    Mutant(
        name="replay-always-persistent",
        path="consumer/tools/dlq.py",
        old="            if mode == aio_pika.DeliveryMode.NOT_PERSISTENT\n",
        new="            if False\n",
        promise=OTHER_CLIENTS,
        tests=(T_DLQ_PROPERTIES,),
    ),
    # issue 27 (hunt): survivors found where a doc states a number or an outcome
    Mutant(
        name="outbox-oldest-age-of-the-newest",
        path="bulk_recorder/producer/outbox.py",
        old="clock_timestamp() - min(created_at)",
        new="clock_timestamp() - max(created_at)",
        promise=PRODUCER,
        tests=(T_OUTBOX_STATS,),
    ),
    Mutant(
        name="outbox-backlog-counts-parked-rows",
        path="bulk_recorder/producer/outbox.py",
        old='FROM outbox WHERE parked_at IS NULL\n"""',
        new='FROM outbox\n"""',
        promise=PRODUCER,
        tests=(T_OUTBOX_STATS,),
    ),
    Mutant(
        name="pg-host-default-timeout-not-5-s",
        path="bulk_recorder/infra/pg_hosts.py",
        old="DEFAULT_HOST_TIMEOUT_S = 5.0\n",
        new="DEFAULT_HOST_TIMEOUT_S = 15.0\n",
        promise=DB_FAILOVER,
        tests=(
            "tests/integration/test_db_hosts.py::"
            "test_without_connect_timeout_a_silent_host_is_given_5_seconds",
        ),
    ),
    Mutant(
        name="relay-deaf-to-notify",
        path="bulk_recorder/producer/outbox.py",
        old="lambda *_args: wake()",
        new="lambda *_args: None",
        promise=PRODUCER,
        tests=(T_RELAY_WAKES + "test_a_notification_wakes_the_relay_long_before_its_poll",),
    ),
    Mutant(
        name="relay-poll-not-1-s",
        path="bulk_recorder/relay_settings.py",
        old="DEFAULT_POLL_INTERVAL_S = 1.0\n",
        new="DEFAULT_POLL_INTERVAL_S = 10.0\n",
        promise=PRODUCER,
        tests=(T_RELAY_WAKES + "test_without_a_notification_the_relay_polls_every_second",),
    ),
    Mutant(
        name="queue-watch-not-every-5-s",
        path="consumer/queue_watch.py",
        old="DEFAULT_INTERVAL_S = 5.0\n",
        new="DEFAULT_INTERVAL_S = 15.0\n",
        promise=PRODUCER,
        tests=(
            "tests/integration/test_queue_watch.py::test_the_queue_is_looked_at_every_5_seconds",
        ),
    ),
    Mutant(
        name="idempotency-key-of-255-refused",
        path="bulk_recorder/producer/api/body.py",
        old="0 < len(value) <= MAX_IDEMPOTENCY_KEY_LEN",
        new="0 < len(value) < MAX_IDEMPOTENCY_KEY_LEN",
        promise=PRODUCER,
        tests=(
            "tests/integration/test_idempotency_keys.py::"
            "test_the_longest_idempotency_key_is_accepted_and_replays",
        ),
        fast=True,
    ),
    Mutant(
        name="last-delivery-zero-before-the-first",
        path="consumer/queue_watch.py",
        old='set_to_current_time()  # "never" reads as "since start"',
        new='set(0)  # "never" reads as "since start"',
        promise=PRODUCER,
        tests=(
            "tests/unit/test_queue_watch.py::"
            "test_before_any_delivery_the_last_delivery_time_is_the_start",
        ),
        fast=True,
    ),
    # issue 29: the dry run's plan as JSON
    Mutant(
        name="dry-run-json-printed-as-text",
        path="consumer/tools/dlq.py",
        old="    if as_json:\n        document = {",
        new="    if False:\n        document = {",
        promise=DLQ_BY_REASON,
        tests=(T_BY_REASON + "test_cli_dlq_by_reason",),
    ),
    # issue 28 (growth): time-ordered ids; retention in bounded batches
    Mutant(
        name="uuid7-falls-back-to-v4",
        path="bulk_recorder/infra/ids.py",
        old="    return str(uuid.UUID(int=value))\n",
        new="    return str(uuid.uuid4())\n",
        promise=TIME_ORDERED_IDS,
        tests=(
            T_IDS + "test_version_and_variant_bits_are_rfc_9562_v7",
            T_IDS + "test_ids_are_strictly_increasing_across_calls",
        ),
        fast=True,
    ),
    Mutant(
        name="uuid7-counter-not-raised-within-a-millisecond",
        path="bulk_recorder/infra/ids.py",
        old="            elif self.counter < _COUNTER_MAX:\n                self.counter += 1\n",
        new=(
            "            elif self.counter < _COUNTER_MAX:\n"
            "                self.counter = rng.getrandbits(11)\n"
        ),
        promise=TIME_ORDERED_IDS,
        tests=(T_IDS + "test_order_holds_within_one_millisecond_and_past_the_counter",),
        fast=True,
    ),
    Mutant(
        name="retention-window-in-hours",
        path="bulk_recorder/producer/retention.py",
        old='_CUTOFF = "SELECT now() - make_interval(days => $1)"',
        new='_CUTOFF = "SELECT now() - make_interval(hours => $1)"',
        promise=RETENTION,
        tests=(T_RETENTION + "test_past_the_window_goes_inside_it_stays_and_unfinished_jobs_stay",),
        fast=True,
    ),
    Mutant(
        name="retention-removes-unfinished-jobs",
        path="bulk_recorder/producer/retention.py",
        old="WHERE created_at < $1 AND completed_at IS NOT NULL AND dead_lettered = 0",
        new="WHERE created_at < $1 AND dead_lettered = 0",
        promise=RETENTION,
        tests=(T_RETENTION + "test_past_the_window_goes_inside_it_stays_and_unfinished_jobs_stay",),
        fast=True,
    ),
    Mutant(
        name="retention-removes-jobs-with-parked-rows",
        path="bulk_recorder/producer/retention.py",
        old="WHERE created_at < $1 AND completed_at IS NOT NULL AND dead_lettered = 0",
        new="WHERE created_at < $1 AND completed_at IS NOT NULL",
        promise=RETENTION,
        tests=(T_RETENTION + "test_past_the_window_goes_inside_it_stays_and_unfinished_jobs_stay",),
    ),
    Mutant(
        name="retention-batch-unbounded",
        path="bulk_recorder/producer/retention.py",
        old="status = await conn.execute(sql, *args, policy.batch_size)",
        new="status = await conn.execute(sql, *args, policy.batch_size * 1_000)",
        promise=RETENTION,
        tests=(
            T_RETENTION + "test_every_batch_holds_at_most_batch_size_rows",
            T_RETENTION + "test_a_retried_request_being_removed_waits_less_than_the_bound",
            T_RETENTION_BUSY,
        ),
    ),
    Mutant(
        name="retention-locks-the-table",
        path="bulk_recorder/producer/retention.py",
        old="        status = await conn.execute(sql, *args, policy.batch_size)\n",
        new=(
            "        async with conn.transaction():\n"
            "            await conn.execute(\n"
            '                "LOCK TABLE transaction_requests IN SHARE ROW EXCLUSIVE MODE"\n'
            "            )\n"
            "            status = await conn.execute(sql, *args, policy.batch_size)\n"
        ),
        promise=RETENTION,
        tests=(
            T_RETENTION + "test_a_new_request_never_waits_on_a_long_retention_batch",
            T_RETENTION_BUSY,
        ),
    ),
    Mutant(  # as it was: only the first page of finished jobs, which stuck ones may fill
        name="retention-completes-the-first-page-only",
        path="bulk_recorder/producer/retention.py",
        old="    while rows := await conn.fetch(_DONE_UNMARKED,",
        new="    if rows := await conn.fetch(_DONE_UNMARKED,",
        promise=RETENTION,
        tests=(
            T_RETENTION + "test_jobs_stuck_recording_do_not_keep_a_finished_job_from_completing",
        ),
        fast=True,
    ),
    Mutant(  # as it was: a hash semi-join over a sequential scan of the whole table
        name="retention-batch-reads-the-table",
        path="bulk_recorder/producer/retention.py",
        old=(
            "DELETE FROM transaction_requests WHERE ctid = ANY(ARRAY(\n"
            "    SELECT ctid FROM transaction_requests WHERE created_at < $1\n"
            "    ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED))\n"
        ),
        new=(
            "DELETE FROM transaction_requests WHERE transaction_id IN (\n"
            "    SELECT transaction_id FROM transaction_requests WHERE created_at < $1\n"
            "    ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED)\n"
        ),
        promise=RETENTION,
        tests=(T_RETENTION + "test_a_batch_reads_its_own_rows_never_the_whole_table",),
    ),
    # every literal default docs/settings.md states is the code's (a window or bound changed alone)
    Mutant(
        name="retention-default-not-the-documented-30-days",
        path="bulk_recorder/retention_settings.py",
        old="DEFAULT_RETENTION_DAYS = 30\n",
        new="DEFAULT_RETENTION_DAYS = 31\n",
        promise="Documented defaults are the code's",
        tests=(
            "tests/unit/test_settings.py::test_every_default_docs_settings_states_is_the_codes",
        ),
        fast=True,
    ),
    # partitioned ledger tables (issue 28): bounds to the millisecond, no gap, no row dropped
    Mutant(
        name="partition-bound-in-seconds",
        path=PARTITIONING_SQL,
        old="floor(extract(epoch FROM at) * 1000)",
        new="floor(extract(epoch FROM at))",
        promise=PARTITIONED,
        tests=(
            T_PARTITIONS + "test_the_bound_of_a_millisecond_is_its_uuidv7_prefix",
            T_PARTITIONS
            + "test_every_millisecond_at_every_boundary_lands_in_its_partition_with_no_gap",
        ),
        fast=True,
    ),
    Mutant(
        name="partitions-end-a-millisecond-short",
        path=PARTITIONING_SQL,
        old="period_end := bulk_recorder_uuid_bound((start + step) AT TIME ZONE 'UTC');",
        new="period_end := bulk_recorder_uuid_bound((start + step - interval '1 ms')"
        " AT TIME ZONE 'UTC');",
        promise=PARTITIONED,
        tests=(
            T_PARTITIONS
            + "test_every_millisecond_at_every_boundary_lands_in_its_partition_with_no_gap",
        ),
        fast=True,
    ),
    Mutant(
        name="partition-cut-short-by-the-next-skips-the-rest-of-its-span",
        path=PARTITIONING_SQL,
        old="                lo := hi;\n",
        new="                lo := period_end;\n",
        promise=PARTITIONED,
        tests=(
            T_PARTITIONS
            + "test_every_millisecond_at_every_boundary_lands_in_its_partition_with_no_gap",
        ),
        fast=True,
    ),
    Mutant(
        name="partitioning-drops-a-ledger-holding-rows",
        path=PARTITIONING_SQL,
        old="        IF has_rows THEN\n",
        new="        IF has_rows AND false THEN\n",
        promise=PARTITIONED,
        tests=(
            T_PARTITIONS
            + "test_the_command_partitions_an_empty_ledger_once_and_refuses_one_with_rows",
        ),
    ),
    Mutant(
        name="partitions-rig-never-nudges",
        path="tests/partitions/conftest.py",
        old="        if waited < self.after:\n            return\n",
        new="        if True:\n            return\n",
        promise=NETWORK_PARTITIONS,
        tests=(
            "tests/partitions/test_rig.py::"
            "test_a_node_back_from_pause_minority_stuck_in_global_is_brought_back",
        ),
    ),
    # Issue 40: the rigs read their nodes with erl_call; what the partition and node-loss
    # proofs wait on (a node running, a queue's leader and counts) must be what rabbitmqctl says.
    Mutant(
        name="rig-reads-a-stopped-rabbit-as-running",
        path="tests/rigs/rabbitmq_node.py",
        old='f"case rabbit:is_running() of false -> not_running; true -> {expression} end",',
        new='f"case true of false -> not_running; true -> {expression} end",',
        promise=NETWORK_PARTITIONS,
        tests=(T_RIG_ANSWERS,),
    ),
    Mutant(
        name="rig-counts-only-the-queues-the-asked-node-leads",
        path="tests/rigs/rabbitmq_node.py",
        old='            "|| N <- rabbit_nodes:all_running()]), "\n',
        new='            "|| N <- [node()]]), "\n',
        promise=NODE_LOSS,
        tests=(T_RIG_ANSWERS,),
    ),
    Mutant(
        name="rig-rows-fail-on-a-queue-that-ends-meanwhile",
        path="tests/rigs/rabbitmq_node.py",
        old='            "rabbit_misc:with_exit_handler(fun() -> [] end, "\n',
        new='            "(fun(_, F) -> F() end)(fun() -> [] end, "\n',
        promise=NODE_LOSS,
        tests=(T_RIG_ROW_ENDS,),
    ),
    Mutant(
        name="rig-calls-share-a-name-a-second",
        path="tests/rigs/rabbitmq_node.py",
        old='"-c", self.cookie, "-h", _caller(), "-e"]),',
        new='"-c", self.cookie, "-r", "-e"]),',
        promise=NODE_LOSS,
        tests=("tests/cluster/test_rigs.py::test_questions_asked_of_one_node_at_once_all_answer",),
    ),
    Mutant(
        name="rig-starts-its-joined-nodes-together",
        path="tests/rigs/rabbitmq_cluster.py",
        old='        for node in others:\n            node.erl_ok("rabbit:start()", timeout=120)\n',
        new='        _parallel(others, lambda n: n.erl_ok("rabbit:start()", timeout=120))\n',
        promise=NODE_LOSS,
        tests=(
            "tests/unit/test_rig_join.py::test_joined_nodes_start_one_at_a_time_after_every_join",
        ),
        fast=True,
    ),
    Mutant(
        name="demo-ports-from-the-kernels-range",
        path="consumer/tools/demo_support.py",
        old="candidates = range(PICK_FROM.start, min(PICK_FROM.stop, _ephemeral_low()))",
        new="candidates = range(0)",
        promise=PRODUCER,
        tests=(
            "tests/unit/test_demo_ports.py::test_the_ports_are_below_the_kernels_range_and_free",
        ),
        fast=True,
    ),
    Mutant(
        name="ports-handed-out-again-while-kept",
        path="consumer/tools/demo_support.py",
        old="                    return False  # handed out lately, maybe not bound yet\n",
        new="                    return True\n",
        promise=PRODUCER,
        tests=(
            "tests/unit/test_demo_ports.py::"
            "test_a_port_another_process_picked_is_not_handed_out_again",
        ),
        fast=True,
    ),
    Mutant(
        name="ports-kept-a-minute-only",
        path="consumer/tools/demo_support.py",
        old="KEPT_S = 600.0\n",
        new="KEPT_S = 60.0\n",
        promise=PRODUCER,
        tests=(
            "tests/unit/test_demo_ports.py::test_a_port_is_handed_out_again_once_kept_long_enough",
        ),
        fast=True,
    ),
    Mutant(
        name="publisher-forgets-a-failed-chunks-ids",
        path="tests/cluster/traffic.py",
        old="                    self.unconfirmed[record_type] |= ids\n",
        new="                    pass\n",
        promise=NETWORK_PARTITIONS,
        tests=(
            "tests/faults/test_traffic_retries.py::"
            "test_a_chunk_published_again_keeps_the_first_attempts_ids",
        ),
        fast=True,
    ),
    Mutant(
        name="a-flush-that-inserted-nothing-skips-the-standby-wait",
        path="bulk_recorder/recorder/writer.py",
        old="                    await conn.execute(DURABLE_BARRIER)\n",
        new="                    pass\n",
        promise=DB_FAILOVER,
        tests=(
            "tests/cluster/test_sync_commit_ambiguous.py::"
            "test_a_write_whose_rows_are_committed_locally_waits_for_the_standby",
        ),
    ),
    # issue 30: the record rules compiled (setup.py), rewritten for it
    Mutant(
        name="amount-with-a-point-and-no-fraction",
        path="bulk_recorder/records/rules.py",
        old="        and 0 < size - point - 1 <= MAX_AMOUNT_FRACTION_DIGITS\n",
        new="        and 0 <= size - point - 1 <= MAX_AMOUNT_FRACTION_DIGITS\n",
        promise=BAD_DATA,
        tests=("tests/unit/test_amount_shape.py::test_exact_decimal_is_the_published_pattern",),
        fast=True,
    ),
    Mutant(
        name="a-second-debit-leg-replaces-the-first",
        # One leg a side is summed without an addition; a second leg must still be added.
        path="bulk_recorder/records/validation.py",
        old="            debits = op_amount if debits is None else _add(debits, op_amount)\n",
        new="            debits = op_amount\n",
        promise=BAD_DATA,
        tests=("tests/unit/test_records.py::test_sums_are_exact_decimals",),
        fast=True,
    ),
    # issue 38: masking
    # a password holding a quote or a space, a secret name in another case or with a prefix
    Mutant(
        name="password-ends-at-a-quote-or-space",
        path="bulk_recorder/masking.py",
        old='_LINE_END = re.compile(r"[\\r\\n]")',
        new='_LINE_END = re.compile(r"[\\s\'\\"]")',
        promise=LOGS,
        tests=(
            "tests/unit/test_masking.py::test_masked_hides_every_form_of_password",
            "tests/unit/test_masking.py::test_a_settings_error_never_shows_the_password",
        ),
        fast=True,
    ),
    Mutant(
        name="secret-query-name-case-sensitive",
        path="bulk_recorder/masking.py",
        old='    return _NAME_NOISE.sub("", name).lower().endswith(SECRET_NAME_ENDINGS)\n',
        new='    return _NAME_NOISE.sub("", name).endswith(SECRET_NAME_ENDINGS)\n',
        promise=LOGS,
        tests=("tests/unit/test_masking.py::test_a_secret_name_is_masked_in_any_case",),
        fast=True,
    ),
    Mutant(
        name="secret-name-matched-whole-not-by-its-ending",
        path="bulk_recorder/masking.py",
        old='    return _NAME_NOISE.sub("", name).lower().endswith(SECRET_NAME_ENDINGS)\n',
        new='    return _NAME_NOISE.sub("", name).lower() in SECRET_NAME_ENDINGS\n',
        promise=LOGS,
        tests=("tests/unit/test_masking.py::test_a_secret_name_is_masked_in_any_case",),
        fast=True,
    ),
    # issue 38: log formatter
    Mutant(
        name="log-value-cut-before-it-is-masked",
        path="bulk_recorder/infra/logs.py",
        old="    return cut(masked(kept), limit, len(text) - len(kept))\n",
        new="    return masked(cut(kept, limit, len(text) - len(kept)))\n",
        promise=LOGS,
        tests=(
            "tests/unit/test_log_cuts.py::"
            "test_a_node_list_whose_password_straddles_the_cut_shows_none_of_it",
            "tests/unit/test_log_cuts.py::"
            "test_an_argument_is_masked_before_it_is_cut_wherever_the_cut_falls",
            "tests/unit/test_log_cuts.py::"
            "test_a_message_is_masked_before_it_is_cut_wherever_the_cut_falls",
        ),
        fast=True,
    ),
    Mutant(
        name="url-across-the-masking-bound-shown",
        path="bulk_recorder/infra/logs.py",
        old="        kept = kept[:url]\n",
        new="        pass\n",
        promise=LOGS,
        tests=(
            "tests/unit/test_log_cuts.py::test_a_password_across_the_masking_bound_is_never_shown",
        ),
        fast=True,
    ),
    Mutant(
        name="userinfo-across-the-masking-bound-shown",
        path="bulk_recorder/infra/logs.py",
        old="    return kept[: mark.start()] if mark else kept\n",
        new="    return kept\n",
        promise=LOGS,
        tests=(
            "tests/unit/test_log_cuts.py::test_a_password_across_the_masking_bound_is_never_shown",
        ),
        fast=True,
    ),
    Mutant(
        name="traceback-not-masked",
        path="bulk_recorder/infra/logs.py",
        old='    return masked("".join(summary.format()).removesuffix("\\n"))\n',
        new='    return "".join(summary.format()).removesuffix("\\n")\n',
        promise=LOGS,
        tests=(
            "tests/unit/test_log_tracebacks.py::test_a_password_in_an_exceptions_text_is_masked",
            "tests/unit/test_log_tracebacks.py::test_a_password_in_a_source_line_is_masked",
        ),
        fast=True,
    ),
    Mutant(
        name="chained-traceback-not-escaped",
        path="bulk_recorder/infra/logs.py",
        old="(each.__cause__, each.__context__)",
        new="(each.__cause__,)",
        promise=LOGS,
        tests=(
            "tests/unit/test_log_tracebacks.py::"
            "test_an_implicitly_chained_traceback_is_escaped_in_text",
            "tests/unit/test_log_tracebacks.py::test_no_exception_text_adds_a_line_to_a_traceback",
        ),
        fast=True,
    ),
    Mutant(
        name="caused-traceback-not-escaped",
        path="bulk_recorder/infra/logs.py",
        old="(each.__cause__, each.__context__)",
        new="(each.__context__,)",
        promise=LOGS,
        tests=(
            "tests/unit/test_log_tracebacks.py::test_no_exception_text_adds_a_line_to_a_traceback",
        ),
        fast=True,
    ),
    Mutant(
        name="exception-group-traceback-not-escaped",
        path="bulk_recorder/infra/logs.py",
        old="        pending.extend(each.exceptions or ())\n",
        new="",
        promise=LOGS,
        tests=(
            "tests/unit/test_log_tracebacks.py::test_no_exception_text_adds_a_line_to_a_traceback",
        ),
        fast=True,
    ),
    Mutant(
        name="exception-note-not-escaped",
        path="bulk_recorder/infra/logs.py",
        old="            each.__notes__ = [_one_line(note) for note in each.__notes__]\n",
        new="            pass\n",
        promise=LOGS,
        tests=(
            "tests/unit/test_log_tracebacks.py::test_no_exception_text_adds_a_line_to_a_traceback",
        ),
        fast=True,
    ),
    Mutant(
        name="another-formatters-traceback-reused",
        path="bulk_recorder/infra/logs.py",
        old="            record.exc_text = None\n",
        new="            pass\n",
        promise=LOGS,
        tests=(
            "tests/unit/test_log_tracebacks.py::"
            "test_a_traceback_another_formatter_wrote_first_is_made_safe_again",
        ),
        fast=True,
    ),
    Mutant(
        name="stack-info-not-masked",
        path="bulk_recorder/infra/logs.py",
        old="        return masked(stack_info)\n",
        new="        return stack_info\n",
        promise=LOGS,
        tests=("tests/unit/test_log_tracebacks.py::test_a_stack_is_masked_in_text",),
        fast=True,
    ),
    # issue 38: metadata numbers and nesting
    Mutant(
        name="metadata-zero-exponent-unbounded",
        # A zero has no digits to count, but PostgreSQL refuses its exponent as written from
        # 1,073,741,823 on: 202 from the API, then 22003 on every delivery, then the DLQ.
        path="bulk_recorder/records/rules.py",
        old=" or exponent > MAX_METADATA_EXPONENT:\n",
        new=":\n",
        promise=BAD_DATA,
        tests=(
            "tests/unit/test_records.py::test_metadata_exponent_bounded_as_postgresql_reads_it",
            "tests/integration/test_metadata_numbers.py::"
            "test_property_decode_refuses_a_metadata_number_exactly_when_postgresql_does",
        ),
        fast=True,
    ),
    Mutant(
        name="metadata-number-read-by-decimal-alone",
        # Decimal reads 0.000e1073741823 as 0e1073741820 (stored by PostgreSQL, this one not),
        # and raises InvalidOperation past its own exponents: "internal error", a WARNING.
        path="bulk_recorder/records/rules.py",
        old="    number = json_number(text)\n",
        new="    number = Decimal(text)\n",
        promise=BAD_DATA,
        tests=(
            "tests/unit/test_records.py::test_metadata_exponent_bounded_as_postgresql_reads_it",
            "tests/unit/test_records.py::"
            "test_metadata_exponent_beyond_decimal_is_out_of_range_not_a_bug",
        ),
        fast=True,
    ),
    Mutant(
        name="explain-reads-numbers-by-decimal-alone",
        # The same, on the path of a body the first pass refused (an unknown field, a digit run).
        path="bulk_recorder/records/schema.py",
        old="PARSE: Final = msgspec.json.Decoder(float_hook=json_number).decode\n",
        new="PARSE: Final = msgspec.json.Decoder(float_hook=Decimal).decode\n",
        promise=BAD_DATA,
        tests=(
            "tests/unit/test_records.py::test_metadata_exponent_bounded_as_postgresql_reads_it",
            "tests/unit/test_records.py::"
            "test_metadata_exponent_beyond_decimal_is_out_of_range_not_a_bug",
        ),
        fast=True,
    ),
    Mutant(
        name="metadata-exponent-bound-one-short",
        path="bulk_recorder/records/schema.py",
        old="            len(digits) == _EXPONENT_DIGITS and digits > _MAX_EXPONENT_TEXT\n",
        new="            len(digits) == _EXPONENT_DIGITS and digits >= _MAX_EXPONENT_TEXT\n",
        promise=BAD_DATA,
        tests=(
            "tests/unit/test_records.py::test_metadata_exponent_bounded_as_postgresql_reads_it",
            "tests/integration/test_metadata_numbers.py::"
            "test_metadata_number_accepted_exactly_when_postgresql_stores_it",
        ),
        fast=True,
    ),
    Mutant(
        name="metadata-whole-number-past-the-digit-limit-is-a-bug",
        # Explain's canonical body writes 1.000...e16380 as an integer of 16,381 digits: read
        # again by msgspec alone, "internal error while decoding: ValidationError".
        path="bulk_recorder/records/rules.py",
        old="        return metadata(_PARSE_LONG_INTEGERS(bytes(raw).decode()))\n",
        new="        raise\n",
        promise=BAD_DATA,
        tests=(
            "tests/unit/test_records.py::"
            "test_metadata_whole_number_written_with_a_long_fraction_is_kept",
        ),
        fast=True,
    ),
    Mutant(
        name="nesting-fast-path-sized-for-objects",
        # The byte bound of the depth check's fast path computed for object levels (5 bytes
        # each): metadata of 33 levels in arrays, 67 bytes, is recorded.
        path="bulk_recorder/records/validation.py",
        old="len(wire.metadata) < 2 * MAX_DEPTH:\n",
        new="len(wire.metadata) < 5 * MAX_DEPTH:\n",
        promise=BAD_DATA,
        tests=(
            "tests/unit/test_records.py::test_metadata_nesting_at_the_bound_in_the_fewest_bytes",
        ),
        fast=True,
    ),
    Mutant(
        name="nesting-fast-path-one-byte-past-the-fewest",
        # 33 levels take at least 67 bytes: a bound of 68 lets exactly the smallest through.
        path="bulk_recorder/records/validation.py",
        old="len(wire.metadata) < 2 * MAX_DEPTH:\n",
        new="len(wire.metadata) < 2 * MAX_DEPTH + 4:\n",
        promise=BAD_DATA,
        tests=(
            "tests/unit/test_records.py::test_metadata_nesting_at_the_bound_in_the_fewest_bytes",
        ),
        fast=True,
    ),
    Mutant(
        name="nesting-walk-one-level-past-the-bound",
        path="bulk_recorder/records/explain.py",
        old="    if _depth_exceeds(PARSE(body), MAX_DEPTH):\n",
        new="    if _depth_exceeds(PARSE(body), MAX_DEPTH + 1):\n",
        promise=BAD_DATA,
        tests=(
            "tests/unit/test_records.py::test_metadata_nesting_at_the_bound_in_the_fewest_bytes",
        ),
        fast=True,
    ),
    Mutant(
        name="explain-nesting-one-level-past-the-bound",
        path="bulk_recorder/records/explain.py",
        old="and _depth_exceeds(tree, MAX_DEPTH):\n",
        new="and _depth_exceeds(tree, MAX_DEPTH + 1):\n",
        promise=BAD_DATA,
        tests=(
            "tests/unit/test_records.py::test_metadata_nesting_at_the_bound_in_the_fewest_bytes",
        ),
        fast=True,
    ),
    # issue 38: dlq inspect arrivals
    # A pass holds what is dead-lettered while it reads however many arrive, not at most the
    # DLQ's size, up to HOLD_ARRIVALS_MAX read within HOLD_ARRIVALS_S; past either it says so
    # and exits 1
    Mutant(
        name="survey-holds-arrivals-up-to-the-dlq-size",
        # the old bound: 2,000 newcomers on a DLQ of 200, 1,800 of them ahead of it
        path="consumer/tools/dlq.py",
        old="            in_order = await hold_arrivals(queue, kept, total)\n",
        new="            in_order = await hold_arrivals(queue, kept, total, total)\n",
        promise=DLQ_BY_REASON,
        tests=(T_ARRIVALS + "test_inspect_keeps_a_burst_ten_times_the_dlq_behind_it",),
    ),
    Mutant(
        name="pass-holds-arrivals-up-to-the-dlq-size",
        path="consumer/tools/dlq_pass.py",
        old="            self.in_order = await hold_arrivals(queue, self.kept, self.total)\n",
        new=(
            "            self.in_order = await hold_arrivals("
            "queue, self.kept, self.total, self.total)\n"
        ),
        promise=DLQ_BY_REASON,
        tests=(
            T_ARRIVALS
            + "test_replay_with_a_limit_takes_the_oldest_after_a_burst_larger_than_the_dlq",
        ),
    ),
    Mutant(
        name="arrivals-ceiling-one-short",
        path="consumer/tools/dlq_pass.py",
        old="    while held < most and loop.time() < deadline:\n",
        new="    while held < most - 1 and loop.time() < deadline:\n",
        promise=DLQ_BY_REASON,
        tests=(T_ARRIVALS + "test_the_hold_stops_at_its_ceiling_and_says_so",),
        fast=True,
    ),
    Mutant(
        name="arrivals-past-the-ceiling-unsaid",
        # the ceiling reached and the rest left ahead, silently, exit 0
        path="consumer/tools/dlq_pass.py",
        old="    ahead = count.ready\n",
        new="    ahead = 0\n",
        promise=DLQ_BY_REASON,
        tests=(T_ARRIVALS + "test_the_hold_stops_at_its_ceiling_and_says_so",),
        fast=True,
    ),
    Mutant(
        name="arrivals-held-without-a-time-bound",
        path="consumer/tools/dlq_pass.py",
        old="    while held < most and loop.time() < deadline:\n",
        new="    while held < most:\n",
        promise=DLQ_BY_REASON,
        tests=(T_ARRIVALS + "test_the_hold_stops_after_its_time_and_says_so",),
        fast=True,
    ),
    Mutant(
        name="inspect-order-lost-exits-0",
        path="consumer/tools/dlq.py",
        old='print("\\n".join(groups.lines(settings.dead_letter_queue)), file=out)\n'
        "    return 0 if in_order else 1\n",
        new='print("\\n".join(groups.lines(settings.dead_letter_queue)), file=out)\n    return 0\n',
        promise=DLQ_BY_REASON,
        tests=(T_ARRIVALS + "test_the_hold_stops_at_its_ceiling_and_says_so",),
    ),
    Mutant(
        name="replay-order-lost-exits-0",
        path="consumer/tools/dlq.py",
        old="    return code or int(not (in_order and done.in_order))\n",
        new="    return code\n",
        promise=DLQ_BY_REASON,
        tests=(T_ARRIVALS + "test_the_hold_stops_at_its_ceiling_and_says_so",),
    ),
    # issue 38: relay claim, partitions, loop lag, stop budget
    Mutant(
        name="claim-window-takes-rows-refused-for-now",
        path="bulk_recorder/producer/relay_claim.py",
        old="available_at <= now()\n  AND id >= (SELECT id FROM first)\n",
        new="TRUE\n  AND id >= (SELECT id FROM first)\n",
        promise=PRODUCER,
        tests=(
            T_RELAY_CLAIM + "test_a_row_refused_for_now_is_not_claimed_before_its_retry_time",
            T_RELAY_CLAIM + "test_a_refused_row_is_claimed_from_the_moment_its_retry_time_comes",
        ),
    ),
    Mutant(
        name="loop-lag-counts-its-own-sleep",
        path="bulk_recorder/producer/api/loop_lag.py",
        old="        due = loop.time() + sample_s\n",
        new="        due = loop.time()\n",
        promise="Operable",
        tests=(
            "tests/unit/test_loop_lag.py::test_an_idle_loop_shows_no_lag_not_the_samplers_own_sleep",
            "tests/unit/test_loop_lag.py::test_a_held_loop_shows_the_hold_less_the_time_already_waited",
        ),
        fast=True,
    ),
    Mutant(
        name="partitions-ahead-counts-days",
        path="consumer/tools/partitions.py",
        old="return day - timedelta(days=day.weekday()) + timedelta(weeks=1 + ahead)\n",
        new="return day - timedelta(days=day.weekday()) + timedelta(weeks=1, days=ahead)\n",
        promise=PARTITIONED,
        tests=(
            T_PARTITIONS + "test_ahead_covers_the_span_holding_today_and_that_many_spans_past_it",
        ),
    ),
    Mutant(
        name="partitions-ahead-from-now-ends-a-span-short",
        path="consumer/tools/partitions.py",
        old="        return day + timedelta(days=1 + ahead)\n",
        new="        return now + timedelta(days=ahead)\n",
        promise=PARTITIONED,
        tests=(
            T_PARTITIONS + "test_ahead_covers_the_span_holding_today_and_that_many_spans_past_it",
        ),
    ),
    Mutant(
        name="partitions-ahead-months-of-31-days",
        path="consumer/tools/partitions.py",
        old="    return day.replace(year=months // 12, month=months % 12 + 1, day=1)\n",
        new="    return now + timedelta(days=31 * ahead)\n",
        promise=PARTITIONED,
        tests=(
            T_PARTITIONS + "test_ahead_covers_the_span_holding_today_and_that_many_spans_past_it",
        ),
    ),
    Mutant(
        name="no-reserve-for-close-ok",
        path="bulk_recorder/infra/stop_budget.py",
        old="CLOSE_OK_S: Final = 2.0\n",
        new="CLOSE_OK_S: Final = 0.0\n",
        promise=SHUTDOWN,
        tests=(
            "tests/faults/test_stop_budget.py::"
            "test_recorder_stops_within_its_budget_with_the_broker_held_after_the_cancel",
        ),
    ),
    # issue 38: bounds at their boundary (retention and settings)
    Mutant(
        name="retention-jobs-kept-for-the-idempotency-window",
        path="bulk_recorder/producer/retention.py",
        old="    cutoff = await _cutoff(conn, policy.job_days)\n",
        new="    cutoff = await _cutoff(conn, policy.idempotency_days)\n",
        promise=RETENTION,
        tests=(
            "tests/integration/test_retention_bounds.py::test_each_table_keeps_its_own_window_to_the_hour",
        ),
        fast=True,
    ),
    Mutant(
        name="retention-command-reads-the-idempotency-window-for-jobs",
        path="consumer/tools/retention.py",
        old="job_days=settings.api_job_retention_days,",
        new="job_days=settings.api_idempotency_retention_days,",
        promise=RETENTION,
        tests=(
            "tests/integration/test_retention_bounds.py::test_each_table_keeps_its_own_window_to_the_hour",
        ),
    ),
    Mutant(
        name="retention-removes-one-batch-of-jobs",
        path="bulk_recorder/producer/retention.py",
        old="        if removed == 0:  # held by someone",
        new="        if True:  # held by someone",
        promise=RETENTION,
        tests=(
            "tests/integration/test_retention_bounds.py::test_every_expired_job_goes_past_one_batch_and_past_a_held_one",
        ),
        fast=True,
    ),
    Mutant(
        name="retention-spins-on-a-held-job",
        path="bulk_recorder/producer/retention.py",
        old="the next run takes them\n            break\n",
        new="the next run takes them\n            pass\n",
        promise=RETENTION,
        tests=(
            "tests/integration/test_retention_bounds.py::test_every_expired_job_goes_past_one_batch_and_past_a_held_one",
        ),
    ),
    Mutant(
        name="retention-gave-way-exits-0",
        path="consumer/tools/retention.py",
        old="    return 1 if done.gave_way else 0\n",
        new="    return 0\n",
        promise=RETENTION,
        tests=(
            "tests/integration/test_retention_bounds.py::test_a_batch_held_past_the_lock_timeout_gives_way_exits_1_and_the"
            "_next_run_takes_it",
        ),
    ),
    Mutant(
        name="retention-lock-timeout-in-seconds",
        path="bulk_recorder/producer/retention.py",
        old='f"{int(policy.lock_timeout_ms)}ms"',
        new='f"{int(policy.lock_timeout_ms)}s"',
        promise=RETENTION,
        tests=(
            "tests/integration/test_retention_bounds.py::test_a_batch_held_past_the_lock_timeout_gives_way_exits_1_and_the"
            "_next_run_takes_it",
        ),
    ),
    Mutant(
        name="retention-window-of-0-days-accepted",
        path="bulk_recorder/retention_settings.py",
        old=(
            "    api_idempotency_retention_days: int = Field(\n"
            "        DEFAULT_RETENTION_DAYS,\n        ge=1,\n"
        ),
        new=(
            "    api_idempotency_retention_days: int = Field(\n"
            "        DEFAULT_RETENTION_DAYS,\n        ge=0,\n"
        ),
        promise=BAD_SETTINGS,
        tests=("tests/unit/test_settings.py::test_a_retention_window_runs_from_1_day_to_36500",),
        fast=True,
    ),
    Mutant(
        name="job-retention-window-capped-at-10-years",
        path="bulk_recorder/retention_settings.py",
        old=(
            "    api_job_retention_days: int = Field(\n"
            "        DEFAULT_RETENTION_DAYS,\n        ge=1,\n        le=36_500,\n"
        ),
        new=(
            "    api_job_retention_days: int = Field(\n"
            "        DEFAULT_RETENTION_DAYS,\n        ge=1,\n        le=3_650,\n"
        ),
        promise=BAD_SETTINGS,
        tests=("tests/unit/test_settings.py::test_a_retention_window_runs_from_1_day_to_36500",),
        fast=True,
    ),
    Mutant(
        name="option-of-0-accepted-as-positive",
        path="consumer/arguments.py",
        old="    if value is None or value < 1:\n",
        new="    if value is None or value < 0:\n",
        promise=BAD_SETTINGS,
        tests=(
            "tests/unit/test_cli_arguments.py::test_a_count_or_timeout_of_0_is_refused_and_1_is_taken",
        ),
        fast=True,
    ),
    Mutant(
        name="secret-file-with-c1-controls-accepted",
        path="settings.py",
        old="ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0 for char",
        new="ord(char) < 0x20 for char",
        promise=BAD_SETTINGS,
        tests=(
            "tests/unit/test_secret_files.py::"
            "test_c0_del_and_c1_controls_in_a_secret_file_are_refused_not_echoed",
        ),
        fast=True,
    ),
    Mutant(
        name="migrate-checks-edits-only-when-up-to-date",
        path="bulk_recorder/infra/migrate.py",
        old="        done = await _recorded_checksums(conn) or {}\n        check_unedited(done)\n",
        new="        done = await _recorded_checksums(conn) or {}\n",
        promise=BAD_SETTINGS,
        tests=(
            "tests/integration/test_migration_checksums.py::"
            "test_an_edit_is_refused_before_a_pending_migration_is_applied",
        ),
        fast=True,
    ),
    Mutant(
        name="fraction-of-1-refused",
        path="consumer/arguments.py",
        old="    if not 0.0 <= value <= 1.0:  # nan too\n",
        new="    if not 0.0 <= value < 1.0:  # nan too\n",
        promise=BAD_SETTINGS,
        tests=("tests/unit/test_cli_arguments.py::test_a_fraction_runs_from_0_to_1_both_included",),
        fast=True,
    ),
    Mutant(  # the pitfall its comment names: the settings' own ``_lower`` replaces it
        name="api-auth-upper-case-refused",
        path="bulk_recorder/api_settings.py",
        old="    def _api_auth_lower(cls, value: object) -> object:\n",
        new="    def _lower(cls, value: object) -> object:\n",
        promise=BAD_SETTINGS,
        tests=("tests/unit/test_settings.py::test_api_auth_is_read_in_any_case",),
        fast=True,
    ),
    Mutant(
        name="otel-names-case-sensitive",
        path="bulk_recorder/otel_settings.py",
        old='    return [name.strip().lower() for name in value.split(",") if name.strip()]\n',
        new='    return [name.strip() for name in value.split(",") if name.strip()]\n',
        promise=BAD_SETTINGS,
        tests=(
            "tests/unit/test_otel_settings.py::test_what_it_does_is_accepted",
            "tests/unit/test_otel_settings.py::test_the_none_exporter_turns_tracing_off",
        ),
        fast=True,
    ),
    # issue 38: bounds at their boundary (jobs, health, ids, partitions)
    Mutant(
        name="uuid7-counter-seeded-with-12-bits",
        path="bulk_recorder/infra/ids.py",
        old="self.ms, self.counter = now_ms, rng.getrandbits(11)",
        new="self.ms, self.counter = now_ms, rng.getrandbits(12)",
        promise=TIME_ORDERED_IDS,
        tests=(T_IDS + "test_2049_ids_fit_in_one_millisecond_even_from_the_highest_seed",),
        fast=True,
    ),
    Mutant(
        name="job-blocks-refuse-a-job-of-exactly-max-lines",
        path="bulk_recorder/producer/job_blocks.py",
        old="if self.parser.lines > self.max_lines:",
        new="if self.parser.lines >= self.max_lines:",
        promise=UPLOADS,
        tests=(
            "tests/unit/test_job_blocks.py::"
            "test_a_job_of_exactly_max_lines_is_accepted_on_the_workers_path",
        ),
        fast=True,
    ),
    Mutant(
        name="job-blocks-list-parser-rejections-first",
        path="bulk_recorder/producer/job_blocks.py",
        old="    if block.reasons:\n        rejections.sort()\n",
        new="",
        promise=UPLOADS,
        tests=(
            "tests/unit/test_job_blocks.py::"
            "test_rejections_of_the_parser_and_of_validation_are_listed_in_line_order",
        ),
        fast=True,
    ),
    Mutant(
        name="csv-unfinished-line-of-exactly-the-limit-refused",
        path="bulk_recorder/producer/csv_lines.py",
        old="utf8_size(self._tail) > self._limit:",
        new="utf8_size(self._tail) >= self._limit:",
        promise=PRODUCER,
        tests=(
            "tests/unit/test_ingest.py::"
            "test_a_csv_line_of_exactly_the_limit_cut_before_its_newline_is_taken",
        ),
        fast=True,
    ),
    Mutant(
        name="csv-unfinished-line-prechecked-for-2-byte-characters",
        path="bulk_recorder/producer/csv_lines.py",
        old="len(self._tail) > self._limit // 4",
        new="len(self._tail) > self._limit // 2",
        promise=PRODUCER,
        tests=(
            "tests/unit/test_ingest.py::"
            "test_an_unfinished_csv_line_of_4_byte_characters_is_refused_one_past_the_limit",
        ),
        fast=True,
    ),
    Mutant(
        name="csv-open-quoted-field-measured-in-characters",
        path="bulk_recorder/producer/csv_lines.py",
        old="self._pending_size += utf8_size(line) + 1",
        new="self._pending_size += len(line) + 1",
        promise=PRODUCER,
        tests=(
            "tests/unit/test_ingest.py::test_a_csv_quoted_field_left_open_is_measured_in_bytes",
        ),
        fast=True,
    ),
    Mutant(
        name="csv-overlong-line-named-by-the-chunks-first",
        path="bulk_recorder/producer/csv_lines.py",
        old="number = self._line + len(lines) + 1",
        new="number = self._line + 1",
        promise=PRODUCER,
        tests=(
            "tests/unit/test_ingest.py::test_an_overlong_unfinished_csv_line_names_its_own_line",
        ),
        fast=True,
    ),
    Mutant(
        name="partition-coverage-jumps-a-gap",
        path="bulk_recorder/infra/partitions.py",
        old="(edge is not None and lower == edge)",
        new="(edge is not None and lower >= edge)",
        promise=PARTITIONED,
        tests=(
            "tests/integration/test_partition_coverage.py::"
            "test_coverage_runs_from_the_partition_holding_now_to_the_first_gap",
        ),
        fast=True,
    ),
    Mutant(
        name="load-commands-check-the-first-broker-node-only",
        path="consumer/tools/local_only.py",
        old="for url in split_urls(settings.rabbitmq_url)\n",
        new="for url in split_urls(settings.rabbitmq_url)[:1]\n",
        promise=BAD_SETTINGS,
        tests=(
            "tests/unit/test_local_only.py::"
            "test_every_host_a_load_command_writes_to_is_checked_not_only_the_first",
        ),
        fast=True,
    ),
    Mutant(
        name="demo-checks-the-first-database-host-only",
        path="consumer/tools/local_only.py",
        old="pg_hosts.parse(settings.database_url).hosts:",
        new="pg_hosts.parse(settings.database_url).hosts[:1]:",
        promise=BAD_SETTINGS,
        tests=(
            "tests/unit/test_local_only.py::"
            "test_every_host_a_load_command_writes_to_is_checked_not_only_the_first",
        ),
        fast=True,
    ),
    Mutant(
        name="revoke-asks-for-a-single-live-key",
        path="consumer/api_keys.py",
        old="if len(several) > 1 and not args.yes",
        new="if len(several) >= 1 and not args.yes",
        promise=AUTH,
        tests=(
            "tests/integration/test_cli_polish.py::"
            "test_a_client_with_one_live_key_is_revoked_by_name_without_a_question",
        ),
    ),
    Mutant(
        name="revoke-counts-revoked-keys-as-live",
        path="consumer/api_keys.py",
        old="live = [k for k in await list_keys(conn) if k.revoked_at is None]",
        new="live = list(await list_keys(conn))",
        promise=AUTH,
        tests=(
            "tests/integration/test_cli_polish.py::"
            "test_a_client_with_one_live_key_is_revoked_by_name_without_a_question",
        ),
    ),
    Mutant(
        name="scrape-header-names-read-in-lower-case-only",
        path="consumer/health.py",
        old="fields[name.strip().lower()] = value.strip()",
        new="fields[name.strip()] = value.strip()",
        promise="Operable",
        tests=(
            "tests/unit/test_health_scrape.py::"
            "test_a_scrape_gets_openmetrics_and_gzip_whatever_the_case_of_its_header_names",
        ),
        fast=True,
    ),
    # issue 39: a build says what it is
    Mutant(
        name="api-root-path-not-given-to-the-server",
        path="consumer/producer.py",
        old="        root_path=settings.api_root_path,\n",
        new="",
        promise=SPEC,
        tests=(
            "tests/integration/test_docs_offline.py::"
            "test_docs_render_behind_a_proxy_that_strips_a_path_prefix_only_with_api_root_path",
        ),
    ),
    Mutant(
        name="roles-start-without-naming-their-build",
        path="consumer/cli.py",
        old="    if args.command in LONG_RUNNING_NEEDS:  # a role's first line,",
        new="    if False:  # a role's first line,",
        promise="Operable",
        tests=(
            "tests/integration/test_start_up_line.py::"
            "test_a_roles_first_line_names_the_version_and_revision",
        ),
    ),
    Mutant(
        name="problem-examples-all-of-one-status",
        path="bulk_recorder/producer/api/problems.py",
        old='            media["example"] = problem_example(status)\n',
        new='            media["example"] = problem_example(422)\n',
        promise=SPEC,
        tests=(
            "tests/unit/test_openapi_examples.py::test_every_json_answer_has_an_example_of_itself",
        ),
        fast=True,
    ),
    Mutant(
        name="build-info-without-the-revision",
        path="bulk_recorder/infra/metrics.py",
        old="            revision=revision(),\n",
        new='            revision="",\n',
        promise="Operable",
        tests=(
            "tests/integration/test_standard_metrics.py::"
            "test_a_running_role_serves_the_standard_collectors_build_info_and_no_created_series",
        ),
    ),
    Mutant(
        name="revision-ignores-uncommitted-changes",
        path="bulk_recorder/build.py",
        old='("-dirty" if changed.stdout.strip() else "")',
        new='""',
        promise="Operable",
        tests=(
            "tests/unit/test_build_identity.py::test_two_commits_of_one_version_are_told_apart",
        ),
        fast=True,
    ),
    # issue 39: monitoring pages only for this service
    alert_rule(
        name="alert-foreign-api-pages-as-ours",
        old='expr: up{service="bulk-recorder", job="api"} == 0',
        new='expr: up{job="api"} == 0',
    ),
    alert_rule(
        name="alert-foreign-recorder-hides-the-outage",
        old='(sum by (cluster, namespace) (up{service="bulk-recorder", job="recorder"}) > 0)',
        new='(sum by (cluster, namespace) (up{job="recorder"}) > 0)',
    ),
    alert_rule(
        name="alert-one-replica-down-pages-as-critical",
        old='job="recorder"} == 0\n        for: 1m\n        labels:\n          severity: warning',
        new='job="recorder"} == 0\n        for: 1m\n        labels:\n          severity: critical',
    ),
    Mutant(
        name="runbook-url-relative",
        path="deploy/prometheus/alerts.yml",
        old=(
            'runbook_url: "https://github.com/bulk-recorder/bulk-recorder/blob/main/docs/'
            'operations.md#ingestapiabsent"'
        ),
        new='runbook_url: "docs/operations.md#ingestapiabsent"',
        promise="Operable",
        tests=(
            "tests/ops/test_alerts.py::"
            "test_every_runbook_url_leads_to_a_section_of_the_published_operations_guide",
        ),
        fast=True,
    ),
    Mutant(
        name="runbook-base-leaves-the-dashboard-link",
        path="tests/ops/gen_rules.py",
        old="""DASHBOARD.write_text(dashboard.replace(f'"url": "{old}"', f'"url": "{new}"'))""",
        new="DASHBOARD.write_text(dashboard)",
        promise="Operable",
        tests=("tests/ops/test_gen_rules.py::test_one_runbook_base_points_every_link_elsewhere",),
        fast=True,
    ),
    Mutant(
        name="podmonitor-without-the-service-label",
        path="deploy/kubernetes/components/prometheus-operator/podmonitor.yaml",
        old="          targetLabel: service\n",
        new="          targetLabel: app\n",
        promise="Operable",
        tests=(
            "tests/ops/test_kubernetes.py::"
            "test_the_pod_monitor_scrapes_each_role_under_the_job_of_the_alert_rules",
        ),
    ),
    Mutant(
        name="compose-prometheus-without-the-service-label",
        path="deploy/prometheus/prometheus.yml",
        old="      - target_label: service\n        replacement: bulk-recorder\n",
        new="",
        promise="Operable",
        tests=(
            "tests/ops/test_prometheus_live.py::"
            "test_prometheus_config_for_the_live_test_keeps_every_job_and_the_rules",
        ),
        fast=True,
    ),
    Mutant(
        name="dashboard-query-ignores-the-service",
        path="deploy/grafana/dashboards/bulk-recorder.json",
        old='(bulk_recorder_build_info{service=\\"bulk-recorder\\", ',
        new="(bulk_recorder_build_info{",
        promise="Operable",
        tests=(
            "tests/ops/test_dashboard.py::"
            "test_every_query_filters_by_namespace_and_job_and_keeps_namespaces_apart",
        ),
        fast=True,
    ),
    Mutant(
        name="tune-reads-any-applications-recorders",
        path="consumer/tools/tune.py",
        old="""RECORDERS = 'service="bulk-recorder", job="recorder"'""",
        new="""RECORDERS = 'job="recorder"'""",
        promise="Operable",
        tests=(
            "tests/integration/test_tune_sources.py::"
            "test_tune_reads_only_this_services_recorders_by_default",
        ),
        fast=True,
    ),
    # issue 39: the command line by people's habits
    Mutant(
        name="unknown-setting-not-warned",
        path="bulk_recorder/unknown_settings.py",
        old="found.append((name, close[0] if close else None))",
        new="pass",
        promise=BAD_SETTINGS,
        tests=(
            "tests/integration/test_cli_habits.py::"
            "test_a_misspelt_setting_is_named_at_start_up_with_the_closest_real_name",
        ),
    ),
    Mutant(
        name="unknown-setting-read-in-upper-case-only",
        path="bulk_recorder/unknown_settings.py",
        old="        upper = name.upper()\n",
        new="        upper = name\n",
        promise=BAD_SETTINGS,
        tests=(
            "tests/integration/test_cli_habits.py::"
            "test_a_misspelt_setting_is_named_at_start_up_with_the_closest_real_name",
        ),
    ),
    Mutant(
        name="question-read-from-a-pipe",
        path="consumer/arguments.py",
        old="if stdin is None or not stdin.isatty():",
        new="if stdin is None:",
        promise=BAD_SETTINGS,
        tests=("tests/unit/test_cli_habits.py::test_no_question_is_asked_without_a_terminal",),
        fast=True,
    ),
    Mutant(
        name="replay-json-checked-after-the-broker",
        path="consumer/arguments.py",
        old="    rep.check(_json_needs_dry_run)\n",
        new="",
        promise=BAD_SETTINGS,
        tests=(
            "tests/unit/test_cli_habits.py::"
            "test_replay_json_without_dry_run_is_a_usage_error_before_the_broker",
        ),
        fast=True,
    ),
    Mutant(
        name="unknown-argument-shown-with-the-top-usage",
        path="consumer/arguments.py",
        old="if extras:",
        new="if False:",
        promise=BAD_SETTINGS,
        tests=(
            "tests/unit/test_cli_habits.py::"
            "test_an_unknown_argument_shows_the_sub_commands_own_usage",
            "tests/unit/test_cli_habits.py::"
            "test_healthcheck_with_an_unknown_option_shows_its_own_usage",
        ),
        fast=True,
    ),
    Mutant(
        name="count-refused-in-argparse-words",
        path="consumer/arguments.py",
        old='f"expected a whole number of 1 or more, got {text!r}"',
        new='f"must be >= 1"',
        promise=BAD_SETTINGS,
        tests=(
            "tests/unit/test_cli_habits.py::test_a_bad_value_is_refused_in_words_naming_the_option",
        ),
        fast=True,
    ),
    Mutant(
        name="poll-interval-takes-any-number",
        path="consumer/cli.py",
        old="type=positive_seconds,",
        new="type=float,",
        promise=BAD_SETTINGS,
        tests=(
            "tests/unit/test_cli_habits.py::test_a_poll_interval_of_0_or_below_names_the_option",
        ),
        fast=True,
    ),
    Mutant(
        name="samples-take-minus-one",
        path="consumer/arguments.py",
        old="if value is None or value < 0:",
        new="if value is None or value < -1:",
        promise=BAD_SETTINGS,
        tests=("tests/unit/test_cli_habits.py::test_a_negative_number_of_samples_is_refused",),
        fast=True,
    ),
    Mutant(
        name="missing-sub-command-named-by-its-dest",
        path="consumer/arguments.py",
        old='message = f"a command is needed: {in_words(list(action.choices))}"',
        new="pass",
        promise=BAD_SETTINGS,
        tests=(
            "tests/unit/test_cli_habits.py::test_a_missing_sub_command_names_the_choices_in_words",
        ),
        fast=True,
    ),
    Mutant(
        name="sub-command-help-without-its-docs",
        path="consumer/arguments.py",
        old="child.epilog = child.epilog or SETTINGS_EPILOG",
        new="pass",
        promise=BAD_SETTINGS,
        tests=(
            "tests/unit/test_cli_habits.py::"
            "test_each_sub_commands_help_says_what_it_does_and_where_its_settings_are",
        ),
        fast=True,
    ),
    Mutant(
        name="no-argument-prints-only-the-usage",
        path="consumer/cli.py",
        old="build_parser().print_help(sys.stderr)",
        new="pass",
        promise=BAD_SETTINGS,
        tests=(
            "tests/unit/test_cli_habits.py::test_no_argument_prints_the_help_on_stderr_and_exits_2",
        ),
        fast=True,
    ),
    Mutant(
        name="otlp-header-value-echoed",
        path="settings.py",
        old="isinstance(value, dict) or field in NEVER_SHOWN",
        new="isinstance(value, dict)",
        promise=BAD_SETTINGS,
        tests=("tests/unit/test_otel_exporter_settings.py::test_a_bad_header_never_shows_a_value",),
        fast=True,
    ),
    Mutant(
        name="otlp-compression-not-checked",
        path="bulk_recorder/otel_settings.py",
        old="if value not in COMPRESSIONS:",
        new="if False:",
        promise=BAD_SETTINGS,
        tests=(
            "tests/unit/test_otel_exporter_settings.py::"
            "test_a_bad_exporter_value_fails_naming_its_variable",
        ),
        fast=True,
    ),
    Mutant(
        name="otlp-general-headers-win-over-the-traces-ones",
        path="bulk_recorder/otel_settings.py",
        old="s.otel_exporter_otlp_traces_headers or s.otel_exporter_otlp_headers",
        new="s.otel_exporter_otlp_headers or s.otel_exporter_otlp_traces_headers",
        promise=BAD_SETTINGS,
        tests=(
            "tests/unit/test_otel_exporter_settings.py::"
            "test_the_exporter_gets_the_values_and_the_traces_form_wins",
        ),
        fast=True,
    ),
    Mutant(
        name="otel-bsp-schedule-delay-fixed",
        path="bulk_recorder/infra/tracing.py",
        old="schedule_delay_millis=settings.otel_bsp_schedule_delay,",
        new="schedule_delay_millis=2000,",
        promise=BAD_SETTINGS,
        tests=(
            "tests/unit/test_otel_exporter_settings.py::"
            "test_the_exporter_gets_the_values_and_the_traces_form_wins",
        ),
        fast=True,
    ),
    Mutant(
        name="database-wait-warns-every-retry",
        path="bulk_recorder/infra/db.py",
        old='log.debug("database at %s still not reachable (%r)", self.where, exc)',
        new='log.warning("database at %s still not reachable (%r)", self.where, exc)',
        promise=BAD_SETTINGS,
        tests=(
            "tests/integration/test_db_wait_lines.py::"
            "test_a_database_wait_is_one_warning_then_debug_then_one_info",
        ),
        fast=True,
    ),
    Mutant(
        name="database-wait-without-its-recovery-line",
        path="bulk_recorder/infra/db.py",
        old="            waiting.up()\n",
        new="",
        promise=BAD_SETTINGS,
        tests=(
            "tests/integration/test_db_wait_lines.py::"
            "test_a_database_wait_is_one_warning_then_debug_then_one_info",
        ),
        fast=True,
    ),
    Mutant(
        name="api-lifecycle-lines-under-uvicorn-error",
        path="consumer/producer.py",
        old="    uvicorn_loggers()\n",
        new="",
        promise=BAD_SETTINGS,
        tests=(
            "tests/integration/test_cli_habits.py::"
            "test_the_apis_lifecycle_lines_are_not_under_uvicorn_error",
        ),
    ),
    # issue 38: no password echoed by a parser's error
    Mutant(
        name="scheme-less-amqp-url-echoed-20-characters",
        path="settings.py",
        old='({scheme!r})" if scheme else "has no scheme"',
        new="({url.split('://')[0][:20]!r})\"",
        promise=LOGS,
        tests=(
            "tests/unit/test_url_leaks.py::test_a_url_setting_without_its_scheme_is_never_echoed",
            "tests/integration/test_log_safety.py::"
            "test_no_piece_of_a_password_leaves_through_a_parsers_error",
        ),
        fast=True,
    ),
    Mutant(
        name="scheme-less-url-setting-value-shown",
        path="settings.py",
        old="        return all(scheme_of(url.strip()) for url in urls if url.strip())\n",
        new="        return True\n",
        promise=LOGS,
        tests=(
            "tests/unit/test_url_leaks.py::test_a_url_setting_without_its_scheme_is_never_echoed",
            "tests/integration/test_log_safety.py::"
            "test_no_piece_of_a_password_leaves_through_a_parsers_error",
        ),
        fast=True,
    ),
    Mutant(
        name="amqp-url-parsers-port-error-echoed",
        path="settings.py",
        old="    if problem:\n        return problem\n    parts = urlsplit(url)\n",
        new=(
            "    parts = urlsplit(url)\n    try:\n        parts.port\n"
            '    except ValueError as exc:\n        return f"cannot be parsed ({exc})"\n'
        ),
        promise=LOGS,
        tests=(
            "tests/unit/test_url_leaks.py::"
            "test_a_password_holding_a_slash_query_or_hash_is_refused_in_our_words",
            "tests/integration/test_log_safety.py::"
            "test_no_piece_of_a_password_leaves_through_a_parsers_error",
        ),
        fast=True,
    ),
    Mutant(
        name="database-url-port-and-query-unchecked",
        path="settings.py",
        old="        problem = url_problem(value, strict_query=True) or _tls_files_problem(\n",
        new="        problem = _tls_files_problem(\n",
        promise=LOGS,
        tests=(
            "tests/unit/test_url_leaks.py::"
            "test_a_password_holding_a_slash_query_or_hash_is_refused_in_our_words",
            "tests/unit/test_url_leaks.py::test_a_port_is_a_number_up_to_65535",
        ),
        fast=True,
    ),
    Mutant(
        name="url-port-bound-past-65535",
        path="bulk_recorder/url_checks.py",
        old="int(text) <= 65_535",
        new="int(text) <= 65_536",
        promise=LOGS,
        tests=("tests/unit/test_url_leaks.py::test_a_port_is_a_number_up_to_65535",),
        fast=True,
    ),
    Mutant(
        name="password-cut-after-the-host-taken",
        path="bulk_recorder/url_checks.py",
        old='    if not at and ":" in hostspec and "@" in after:\n',
        new="    if False:\n",
        promise=LOGS,
        tests=(
            "tests/unit/test_url_leaks.py::"
            "test_a_password_holding_a_slash_query_or_hash_is_refused_in_our_words",
            "tests/integration/test_log_safety.py::"
            "test_no_piece_of_a_password_leaves_through_a_parsers_error",
        ),
        fast=True,
    ),
    Mutant(
        name="database-url-query-read-leniently",
        path="bulk_recorder/url_checks.py",
        old="    if strict_query and parts.query:\n",
        new="    if False:\n",
        promise=LOGS,
        tests=(
            "tests/unit/test_url_leaks.py::"
            "test_a_password_holding_a_slash_query_or_hash_is_refused_in_our_words",
        ),
        fast=True,
    ),
    Mutant(
        name="asyncpg-parse-error-passed-on",
        path="bulk_recorder/infra/pg_hosts.py",
        old='            raise UnreadableUrl("DATABASE_URL") from None\n',
        new="            raise\n",
        promise=LOGS,
        tests=(
            "tests/unit/test_url_leaks.py::test_a_database_url_asyncpg_cannot_read_is_named_not_quoted",
            "tests/integration/test_log_safety.py::"
            "test_no_piece_of_a_password_leaves_through_a_parsers_error",
        ),
        fast=True,
    ),
    Mutant(
        name="aio-pika-parse-error-passed-on",
        path="bulk_recorder/infra/broker.py",
        old='                raise UnreadableUrl("RABBITMQ_URL") from None\n',
        new="                raise\n",
        promise=LOGS,
        tests=(
            "tests/unit/test_url_leaks.py::test_a_node_aio_pika_cannot_read_is_named_not_quoted",
        ),
        fast=True,
    ),
    Mutant(
        name="reach-line-quotes-a-parsers-value-error",
        path="bulk_recorder/infra/reach.py",
        old="        return UNREADABLE\n",
        new="        pass\n",
        promise=LOGS,
        tests=(
            "tests/unit/test_url_leaks.py::"
            "test_a_value_error_is_given_in_our_words_by_reach_and_failure_lines",
        ),
        fast=True,
    ),
    Mutant(
        name="tune-lets-urllibs-value-error-through",
        path="consumer/tools/tune.py",
        old="    except (http.client.InvalidURL, ValueError):\n",
        new="    except http.client.InvalidURL:\n",
        promise=LOGS,
        tests=(
            "tests/unit/test_url_leaks.py::test_tune_says_a_metrics_url_it_cannot_read_in_our_words",
            "tests/integration/test_log_safety.py::test_tune_never_quotes_a_url_it_cannot_read",
        ),
        fast=True,
    ),
    Mutant(
        name="tune-shows-a-url-with-no-scheme",
        path="consumer/tools/tune.py",
        old='    shown = url if scheme_of(url) else "a URL with no scheme (http://)"\n',
        new="    shown = url\n",
        promise=LOGS,
        tests=(
            "tests/unit/test_url_leaks.py::test_tune_says_a_metrics_url_it_cannot_read_in_our_words",
            "tests/integration/test_log_safety.py::test_tune_never_quotes_a_url_it_cannot_read",
        ),
        fast=True,
    ),
    Mutant(
        name="tune-reads-a-cut-password-url-unchecked",
        path="consumer/tools/tune.py",
        old="    if problem:\n        raise TuneSourceError(",
        new="    if False:\n        raise TuneSourceError(",
        promise=LOGS,
        tests=(
            "tests/unit/test_url_leaks.py::test_tune_says_a_metrics_url_it_cannot_read_in_our_words",
            "tests/integration/test_log_safety.py::test_tune_never_quotes_a_url_it_cannot_read",
        ),
        fast=True,
    ),
    Mutant(
        name="shard-route-unbound-before-the-new-one-is-bound",
        path="consumer/topology.py",
        old=(
            "        await raw.exchange_bind(\n"
            "            destination=topology.shard_exchange, source=topology.exchange, "
            'routing_key="#"\n'
            "        )\n"
            '        await raw.queue_unbind(topology.queue, topology.exchange, routing_key="#")\n'
        ),
        new=(
            '        await raw.queue_unbind(topology.queue, topology.exchange, routing_key="#")\n'
            "        await raw.exchange_bind(\n"
            "            destination=topology.shard_exchange, source=topology.exchange, "
            'routing_key="#"\n'
            "        )\n"
        ),
        promise=SHARDS,
        tests=(
            T_SHARDS + "test_two_processes_changing_the_shard_count_at_once_always_leave_a_route",
        ),
    ),
    Mutant(
        name="route-change-without-the-lock",
        path="consumer/topology.py",
        old="            await lock.queue_declare(name, exclusive=True, auto_delete=True)\n",
        new="            pass\n",
        promise=SHARDS,
        tests=(
            T_SHARDS + "test_two_processes_changing_the_shard_count_at_once_always_leave_a_route",
        ),
    ),
    Mutant(
        name="leftover-shards-not-consumed",
        path="consumer/topology.py",
        old="        return range(self.shards + 1, MAX_SHARDS + 1)\n",
        new="        return range(0)\n",
        promise=SHARDS,
        tests=(
            T_LEFTOVERS
            + "test_a_record_on_two_shards_is_recorded_once_and_moves_its_balances_once",
        ),
    ),
    Mutant(
        name="release-copy-to-another-shard",
        path="consumer/delivery.py",
        old="            routing_key=self.queue_for(message.channel),\n",
        new="            routing_key=self._queue,\n",
        promise=SHARDS,
        tests=(
            "tests/faults/test_shard_release.py::"
            "test_a_released_delivery_goes_back_to_the_shard_it_came_from",
        ),
    ),
    Mutant(
        name="shard-list-takes-shard-0",
        path="bulk_recorder/shard_settings.py",
        old="    if not 1 <= number <= MAX_SHARDS:\n",
        new="    if not 0 <= number <= MAX_SHARDS:\n",
        promise=BAD_SETTINGS,
        tests=(T_SETTINGS + "test_a_bad_shard_list_names_the_variable_and_the_entry",),
        fast=True,
    ),
    Mutant(
        name="shard-list-takes-shard-65",
        path="bulk_recorder/shard_settings.py",
        old="    if not 1 <= number <= MAX_SHARDS:\n",
        new="    if not 1 <= number <= MAX_SHARDS + 1:\n",
        promise=BAD_SETTINGS,
        tests=(T_SETTINGS + "test_a_bad_shard_list_names_the_variable_and_the_entry",),
        fast=True,
    ),
    Mutant(
        name="shard-replicas-not-declared",
        path="consumer/topology.py",
        old="                arguments[GROUP_SIZE] = self.shard_replicas\n",
        new="                pass\n",
        promise=SHARDS,
        tests=(
            "tests/unit/test_shard_names.py::"
            "test_shard_replicas_set_the_group_size_of_shards_2_to_n_only",
        ),
        fast=True,
    ),
    Mutant(
        name="shard-replicas-on-shard-one-too",
        path="consumer/topology.py",
        old="        if number >= 2:  # shard 1 keeps today's arguments exactly\n",
        new=(
            "        if self.shard_replicas:\n"
            "            arguments[GROUP_SIZE] = self.shard_replicas\n"
            "        if number >= 2:  # shard 1 keeps today's arguments exactly\n"
        ),
        promise=SHARDS,
        tests=(
            "tests/unit/test_shard_names.py::"
            "test_shard_replicas_set_the_group_size_of_shards_2_to_n_only",
        ),
        fast=True,
    ),
    Mutant(
        name="shard-replicas-take-8",
        path="bulk_recorder/shard_settings.py",
        old="        le=MAX_SHARD_REPLICAS,\n",
        new="        le=MAX_SHARD_REPLICAS + 1,\n",
        promise=BAD_SETTINGS,
        tests=(T_SETTINGS + "test_shard_replicas_outside_0_to_7_name_the_variable",),
        fast=True,
    ),
    Mutant(
        name="prune-deletes-a-shard-not-drained",
        path="consumer/tools/shards.py",
        old="        if shard.drained:\n            await channel.queue_delete(queue)\n",
        new="        if True:\n            await channel.queue_delete(queue)\n",
        promise=SHARDS,
        tests=(
            T_LEFTOVERS + "test_a_drained_leftover_is_let_go_and_pruned_and_a_full_one_is_kept",
        ),
    ),
    Mutant(
        name="prune-takes-a-late-zero-for-drained",
        path="consumer/queue_count.py",
        old="    counted = ready > 0 or consumers > 0 or seconds < STAT_TIMEOUT_S\n",
        new="    counted = True\n",
        promise=SHARDS,
        tests=(
            "tests/unit/test_queue_count.py::"
            "test_0_and_0_is_a_count_only_when_answered_within_the_leaders_250_ms",
            T_SHARDS + "test_prune_keeps_a_shard_whose_leader_did_not_count_in_time",
        ),
    ),
    Mutant(
        name="dlq-takes-a-late-zero-for-an-empty-dlq",
        path="consumer/tools/dlq_pass.py",
        old="    if not count.counted:\n"
        "        print(\n"
        '            f"bulk-recorder dlq: no count of',
        new='    if False:\n        print(\n            f"bulk-recorder dlq: no count of',
        promise=DLQ_BY_REASON,
        tests=(T_LATE + "test_dlq_inspect_takes_no_count_for_no_count_not_for_an_empty_dlq",),
    ),
    Mutant(
        name="queue-watch-exports-a-late-zero",
        path="consumer/queue_watch.py",
        old="    if not found.counted:\n        return UNKNOWN, UNKNOWN\n",
        new="",
        promise="Operable",
        tests=(T_LATE + "test_the_queue_watch_exports_unknown_not_0_for_no_count",),
    ),
    Mutant(
        name="queue-watch-tells-a-late-zero-leftover-empty",
        path="consumer/queue_watch.py",
        old="                leftovers[number] = found.reading()\n",
        new="                leftovers[number] = found.ready\n",
        promise=SHARDS,
        tests=(T_LATE + "test_the_queue_watch_tells_no_count_of_a_leftover_not_0",),
    ),
    Mutant(
        name="queue-watch-one-late-shard-blanks-the-others",
        path="consumer/queue_watch.py",
        old="        self.metrics.dlq_messages.set(dead_letters)\n\n    def _unknown",
        new="        self.metrics.dlq_messages.set(dead_letters)\n"
        "        if messages != messages:\n"
        "            for queue in self._shard_labels:\n"
        "                self.metrics.shard_messages.labels(queue=queue).set(UNKNOWN)\n"
        "\n    def _unknown",
        promise=SHARDS,
        tests=(T_LATE + "test_the_queue_watch_tells_no_count_of_a_leftover_not_0",),
    ),
    Mutant(
        name="leftover-let-go-on-no-count",
        path="consumer/consuming.py",
        old="                if ready is None:\n                    continue",
        new="                if ready is None:\n                    pass",
        promise=SHARDS,
        tests=(
            "tests/unit/test_consuming_gone.py::test_a_leftover_with_no_count_is_left_as_it_is",
        ),
    ),
    Mutant(
        name="shards-status-shows-a-late-zero-as-a-count",
        path="consumer/tools/shards.py",
        old='if self.counted else ("?", "?")',
        new='if True else ("?", "?")',
        promise=SHARDS,
        tests=(T_LATE + "test_shards_status_shows_no_count_as_a_question_mark_and_says_why",),
    ),
    Mutant(
        name="cancel-of-a-routed-shard-taken-for-a-pruned-leftover",
        path="consumer/consuming.py",
        old="            if number is not None and number > self.topology.shards:\n",
        new="            if number is not None:\n",
        promise=SHARDS,
        tests=(T_SHARDS + "test_a_deleted_shard_is_declared_again_and_consumed_again",),
    ),
    # Issue 40: a scratch copy reuses the repository's bytecode.
    Mutant(
        name="scratch-copy-leaves-the-bytecode-behind",
        path="tests/mutants/run.py",
        old="        if cache.is_dir():\n",
        new="        if False:\n",
        promise=START_COST,
        tests=(
            "tests/unit/test_mutants.py::"
            "test_a_scratch_copy_reuses_the_bytecode_of_what_it_copies_and_runs_the_mutated_file",
        ),
        fast=True,
    ),
    Mutant(
        name="forked-pytest-keeps-the-servers-tests-package",
        path="tests/mutants/forked.py",
        old="        del sys.modules[name]",
        new="        pass",
        promise=START_COST,
        tests=(
            "tests/unit/test_mutants.py::"
            "test_a_forked_pytest_runs_the_scratch_copy_as_a_new_interpreter_would",
        ),
        fast=True,
    ),
    Mutant(
        name="forked-pytest-ignores-its-timeout",
        path="tests/mutants/forked.py",
        old="    child.join(timeout)\n",
        new="    child.join()\n",
        promise=START_COST,
        tests=(
            "tests/unit/test_mutants.py::"
            "test_a_forked_pytest_runs_the_scratch_copy_as_a_new_interpreter_would",
        ),
    ),
    # Issue 40: what starting a command loads and runs beyond what it needs.
    Mutant(
        name="tracing-loads-opentelemetry-at-import",
        path="bulk_recorder/infra/tracing.py",
        old="from bulk_recorder.masking import masked\n",
        new="import opentelemetry.trace\n\nfrom bulk_recorder.masking import masked\n",
        promise=START_COST,
        tests=(
            T_START_COST
            + "test_no_module_of_the_service_outside_the_api_loads_opentelemetry_when_imported",
        ),
        fast=True,
    ),
    Mutant(
        name="unknown-settings-load-the-sdk-on-every-start",
        path="bulk_recorder/unknown_settings.py",
        old="    if not unread:  # the usual start: the SDK's names (its package) are not even"
        " loaded\n        return []\n",
        new="",
        promise=START_COST,
        tests=(T_START_COST + "test_a_one_shot_command_loads_no_opentelemetry_and_runs_no_git",),
        fast=True,
    ),
    Mutant(
        name="every-parser-describes-the-build",
        path="consumer/cli.py",
        old='    parser.add_argument("--version", action=_BuildVersion)\n',
        new="    from bulk_recorder.build import describe\n\n"
        '    parser.add_argument("--version", action="version", version=describe())\n',
        promise=START_COST,
        tests=(T_START_COST + "test_help_runs_no_git",),
        fast=True,
    ),
    Mutant(
        name="api-package-loads-fastapi",
        path="bulk_recorder/producer/api/__init__.py",
        old="if TYPE_CHECKING:\n    from bulk_recorder.producer.api.app import",
        new="if True:\n    from bulk_recorder.producer.api.app import",
        promise=START_COST,
        tests=(
            T_START_COST
            + "test_no_module_of_the_service_outside_the_api_loads_opentelemetry_when_imported",
        ),
        fast=True,
    ),
)
