"""The one settings module, configured entirely from the environment.

Production needs no code change, only variables. A malformed value stops start-up with
a message naming the variable (see console.env). The launcher (`./run`, `./test`) sets
DATABASE_URL and REDIS_URL to private embedded servers when they are not given.
"""

import os
import re
import socket
from datetime import timedelta
from pathlib import Path

from csp.constants import NONE, SELF

import reports
from console.env import (
    ConfigurationError,
    celery_broker_url_for,
    check_redis_url,
    env_bool,
    env_choice,
    env_int,
    env_list,
    env_str,
    parse_database_url,
)

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("DEBUG", default=False)
SECRET_KEY = env_str("SECRET_KEY")
# Earlier keys, kept after SECRET_KEY is replaced (comma-separated): sessions signed
# with them stay valid, and audit entries authenticated with them still verify.
SECRET_KEY_FALLBACKS = env_list("SECRET_KEY_FALLBACKS", [])
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
HTTPS = env_bool("HTTPS", default=False)

# Connections are kept this long and checked before reuse: a tree hop or an agent's
# request lasts a few milliseconds, and opening a connection costs as much again.
DATABASE_CONN_MAX_AGE_S = env_int("DATABASE_CONN_MAX_AGE_S", 60, minimum=0)
_database = parse_database_url("DATABASE_URL", env_str("DATABASE_URL")).as_django(
    conn_max_age=DATABASE_CONN_MAX_AGE_S
)
# An unreachable server fails a request (or the health check) after this long instead of
# hanging it. A restarted server costs each process one failed request at most: broken
# connections are dropped before reuse (CONN_HEALTH_CHECKS, and console/celery.py).
_database["OPTIONS"]["connect_timeout"] = env_int("DATABASE_CONNECT_TIMEOUT_S", 5, minimum=1)
# The hot statements (broker.prepared) are prepared on a connection's first run of them.
# Off only behind a pooler in transaction mode that cannot keep prepared statements
# (PgBouncer before 1.21): they then cost their planning at every run again.
DATABASE_PREPARED_STATEMENTS = env_bool("DATABASE_PREPARED_STATEMENTS", default=True)
_database["OPTIONS"]["prepare_threshold"] = 0 if DATABASE_PREPARED_STATEMENTS else None
DATABASES = {
    "default": _database,
    # The same database on a connection of its own: refusals are audited through it so
    # that rolling back the refused work cannot roll back its audit entry.
    "audit": {**_database, "TEST": {"MIRROR": "default"}},
}
REDIS_URL = check_redis_url("REDIS_URL", env_str("REDIS_URL"))

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.humanize",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "template_partials",
    "guardian",
    "axes",
    "csp",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "django_otp.plugins.otp_static",
    "console",
    "broker",
    "reports",
    "auditchain",
    "lifecycle",
    "demo",
]

MIDDLEWARE = [
    # First, so that it closes what every later layer and the view opened.
    "console.middleware.CloseDatabaseConnections",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_otp.middleware.OTPMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Sessions of acting roles end when idle or old (the login page says why); a change
    # of roles renews the session's key and CSRF token, and an htmx page gets the token
    # renewed during its request (console/sessions.py).
    "console.sessions.EndSessions",
    "console.sessions.SessionRenewal",
    # A role that changes anything reaches no page before its second factor.
    "console.middleware.RequireSecondFactor",
    "console.middleware.RefuseUnstorableText",
    "console.middleware.RevealInvisibleCharacters",
    # Last: turns a login refused for too many failures into the lockout page (429).
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "console.urls"
ASGI_APPLICATION = "console.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Who may send as which sender client is kept in django-guardian's object permission
# rows (broker.reads.sending.granted_sender_ids); its backend answers has_perm(perm, obj)
# for the admin and integrations. The console has no anonymous user.
AUTHENTICATION_BACKENDS = [
    # First: refuses every login, even with the right password, while its user or its
    # address is locked out (django-axes; docs/security.md).
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
    "guardian.backends.ObjectPermissionBackend",
]
GUARDIAN_ANONYMOUS_USER_NAME = None
LOGIN_URL = "login"

# Password guessing (django-axes): this many failed logins for one username, or from one
# address, within LOGIN_COOLOFF_MIN minutes lock that username or address out until
# that long after its last failure; an admin lifts a lockout on the Sign-in page.
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 10, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("LOGIN_COOLOFF_MIN", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_HTTP_RESPONSE_CODE = 429
# A second factor (TOTP, django-otp) for every role that changes anything; a code this
# fresh before a large send, a trust change, a key rotation or a grant (docs/security.md).
SECOND_FACTOR_FRESH_MIN = env_int("SECOND_FACTOR_FRESH_MIN", 15, minimum=1)
# A user enrols their authenticator on their own only this many days after their
# account was made, or an admin opened enrolment for them: a password taken later
# cannot enrol the thief's phone.
SECOND_FACTOR_ENROL_DAYS = env_int("SECOND_FACTOR_ENROL_DAYS", 7, minimum=1)
OTP_TOTP_ISSUER = "Selective Notification"
# Sessions of the roles that change anything (console/sessions.py) end after this many
# minutes without activity, and this many hours after their login however active: the
# reauthentication NIST SP 800-63B asks at AAL2 (30 minutes idle, 12 hours in all),
# which a shift at the console fits. The auditor's keep Django's cookie age.
SESSION_IDLE_MIN = env_int("SESSION_IDLE_MIN", 30, minimum=1)
SESSION_MAX_HOURS = env_int("SESSION_MAX_HOURS", 12, minimum=1)
if SESSION_IDLE_MIN > SESSION_MAX_HOURS * 60:
    # The idle limit could never be the one that ends a session: a mistaken unit.
    raise ConfigurationError(
        f"SESSION_IDLE_MIN must be at most SESSION_MAX_HOURS x 60 "
        f"({SESSION_MAX_HOURS * 60}), got {SESSION_IDLE_MIN}."
    )

# Whose address a request comes from (broker.inputs.client_address): behind this many
# reverse proxies, the one the nearest proxy saw; with 0, the socket's own peer.
TRUSTED_PROXY_COUNT = env_int("TRUSTED_PROXY_COUNT", 0)
AXES_CLIENT_IP_CALLABLE = "broker.inputs.client_address"
# Successful logins are audited by the console; axes keeps only the failures.
AXES_DISABLE_ACCESS_LOG = True
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(BASE_DIR / "var" / "collected-static")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
# Serve straight from the source folders when static files were not collected, so a
# developer's `manage.py` run needs no collectstatic step.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = HTTPS
SECURE_HSTS_SECONDS = 31536000 if HTTPS else 0
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if HTTPS else None
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
# Content-Security-Policy on every response (django-csp): scripts, styles, images and
# connections from the console itself only; no inline script or style (no nonce is
# needed: the templates have none, and htmx runs without eval), no plugins, no framing.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [NONE],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "font-src": [SELF],
        "connect-src": [SELF],  # the console's socket: same origin, ws: or wss:
        "manifest-src": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
        "base-uri": [NONE],
        "object-src": [NONE],
    }
}

# The Redis that carries pushes to agents' connections (REDIS_URL unless set): a
# deployment may keep this traffic off the Redis that queues the tree's tasks.
CHANNEL_LAYER_URL = check_redis_url("CHANNEL_LAYER_URL", env_str("CHANNEL_LAYER_URL", REDIS_URL))

# Benchmarks only: a Redis list (on the channel layer's Redis) where every push of
# deliveries records when it was sent and which deliveries it carried, so that a
# delivery's latency splits into the tree's part and the push's. Empty: not recorded.
PUSH_LOG_KEY = env_str("PUSH_LOG_KEY", "")

CHANNEL_LAYERS = {
    "default": {
        # channels_redis' layer, plus one message per process for a many-receiver push.
        "BACKEND": "broker.push.layer.FanoutRedisChannelLayer",
        "CONFIG": {
            # redis-py 8 reads with a 5 s socket timeout by default, which is exactly how
            # long the layer's BZPOPMIN waits on an idle channel: every idle consumer
            # would die of a read timeout. The layer bounds its own waits.
            # A pool of this many connections per process; callers beyond it wait
            # (broker.push.layer) rather than fail.
            "hosts": [{"address": CHANNEL_LAYER_URL, "socket_timeout": 30, "max_connections": 200}],
            "prefix": "sn-channels",
            # Messages wait per *process* (every consumer of a web process shares one
            # Redis key), and a full channel drops messages silently. The default of 100
            # would drop most of a broadcast to a thousand agents on one process.
            "capacity": 100_000,
        },
    },
}

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "sn-cache",
    },
}

# Celery: JSON only, late acknowledgement so a worker that dies mid-task loses nothing,
# one message prefetched per process, and no result backend (tasks report through the
# database or Redis keys, never through results).
# The tree's hops travel as Redis streams beside Celery's messages (broker/dispatch/
# transport.py): the same server and database, spelled as redis-py reads it.
HOPS_REDIS_URL = check_redis_url("CELERY_BROKER_URL", env_str("CELERY_BROKER_URL", REDIS_URL))
CELERY_BROKER_URL = celery_broker_url_for(HOPS_REDIS_URL)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A worker that loses Redis reconnects (after 2, 4, 6 ... 30 s) for as long as it takes,
# rather than exiting after 100 attempts. Tasks it was running when the connection went
# can no longer be acknowledged, so they are cancelled rather than run to the end and
# then again: Redis hands them out again (visibility timeout), they are idempotent, and
# the hops they were moving are still in the database's inboxes (the beat's sweep).
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
# A task taken by a worker that dies is handed out again after this many seconds; tasks
# are short and idempotent, so a small value only costs an occasional duplicate run.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env_int("CELERY_VISIBILITY_S", 120, minimum=1),
    # Look for such abandoned tasks every few seconds (one cheap Redis query each).
    "unacked_restore_interval": env_int("CELERY_RESTORE_INTERVAL_S", 5, minimum=1),
    "unacked_restore_throttle": 1,
}
# Celery's Django fixup closes every connection around every task unless this is set;
# console/celery.py closes them by age and health instead (DATABASE_CONN_MAX_AGE_S).
CELERY_DB_REUSE_MAX = 1_000_000
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_DEFAULT_QUEUE", "celery")
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# The dispatcher tree created on first use: levels (1 = a lone root) and children per node.
TREE_DEPTH = env_int("TREE_DEPTH", 3, minimum=1)
TREE_BRANCHING = env_int("TREE_BRANCHING", 2, minimum=1)

# Matching in the tree. Off only for the benchmark's baseline: every event is relayed
# blindly to every client, as a plain broadcast would.
TREE_MATCHING = env_bool("TREE_MATCHING", default=True)
# Hop consumer threads per tree-worker process (broker/dispatch/consumer.py): more than
# one, so that a hop waits for no other dispatcher's database work in that process.
TREE_CONSUMER_THREADS = env_int("TREE_CONSUMER_THREADS", 3, minimum=1)
# How long a process routes with what it read of the vocabulary and the summaries
# without asking PostgreSQL again (broker.vocabulary.FRESH_FOR_S); a grown summary is in
# force everywhere after twice this long. Shorter: more reads, and a tree that settles
# sooner after a change (the tests run with 50 ms).
TREE_FRESH_FOR_MS = env_int("TREE_FRESH_FOR_MS", 500, minimum=10)
# A leaf that took in its clients' changes less than this long ago waits this long
# before it takes in the next ones (broker.dispatch.wakeups): a fleet's load reports come
# a few dozen a second per leaf, and one pass for each cost the tree more than the changes
# themselves. A quiet leaf takes a change in at once. 0: never wait.
TREE_CHANGES_GATHER_MS = env_int("TREE_CHANGES_GATHER_MS", 1000, minimum=0)

# Signing (docs/security.md, "Signed events"): the private keys of the senders the
# console sends for (`senders/NAME.pem`) and of the authorities whose officers attest
# from its Trust page (`authorities/NAME.pem`), on the web hosts, outside the database.
# Empty: the console signs nothing, and agents that verify refuse its events.
SIGNING_KEYS_DIR = env_str("SIGNING_KEYS_DIR", "")
if SIGNING_KEYS_DIR and not Path(SIGNING_KEYS_DIR).is_dir():
    raise ConfigurationError(f"SIGNING_KEYS_DIR is not a folder: {SIGNING_KEYS_DIR!r}.")

# Reports (docs/reports.md). Spark runs in this process's JVM unless a master URL is set;
# on a cluster, REPORTS_DATASET must be a path every executor sees.
SPARK_MASTER = env_str("SPARK_MASTER", "local[*]")
SPARK_DRIVER_MEMORY = env_str("SPARK_DRIVER_MEMORY", "2g")
if not re.fullmatch(r"[1-9][0-9]*[mg]", SPARK_DRIVER_MEMORY):
    raise ConfigurationError(
        f"SPARK_DRIVER_MEMORY must be a size like 2g or 1536m, got {SPARK_DRIVER_MEMORY!r}."
    )
REPORTS_DATASET = Path(env_str("REPORTS_DATASET", str(BASE_DIR / "var" / "reports" / "dataset")))
REPORTS_QUEUE = reports.QUEUE
# The beat runs every report over the last day this often.
REPORTS_INTERVAL_S = env_int("REPORTS_INTERVAL_S", 3600, minimum=60)
# Partitions of a report's shuffles: Spark's 200 suit a big cluster; a small one (or
# one machine) spends longer starting 200 tasks than on the data. 0: one per core on local,
# Spark's 200 on a cluster; set it to 2 to 3 times the cluster's executor cores.
SPARK_SHUFFLE_PARTITIONS = env_int("SPARK_SHUFFLE_PARTITIONS", 0, minimum=0)
# Spark's JVM writes its own lines (its start-up, its log) to this file, appended;
# empty: to the reports worker's output. ./run sets DATA_DIR/spark.log unless --verbose.
SPARK_LOG_FILE = env_str("SPARK_LOG_FILE", "")
if SPARK_LOG_FILE and not Path(SPARK_LOG_FILE).parent.is_dir():
    raise ConfigurationError(f"SPARK_LOG_FILE is in no folder that exists: {SPARK_LOG_FILE!r}.")

# Beat: summaries are recomputed exactly (and may shrink) on this interval; events that
# never reached the root are routed again.
SUMMARY_INTERVAL_S = env_int("SUMMARY_INTERVAL_S", 60, minimum=1)
# Audit entries are linked into the chain on this interval (auditchain).
AUDIT_LINK_S = env_int("AUDIT_LINK_S", 5, minimum=1)
# And the whole log verified on this interval, its outcome shown on the audit page.
AUDIT_VERIFY_S = env_int("AUDIT_VERIFY_S", 3600, minimum=60)
# And the chain's head signed on this interval with the console's audit key, if the
# beat's host holds it (SIGNING_KEYS_DIR/console/audit.pem, manage.py audit_key);
# checkpoints are checked with these public keys (comma-separated) and the host's own.
AUDIT_CHECKPOINT_S = env_int("AUDIT_CHECKPOINT_S", 3600, minimum=10)
AUDIT_CHECKPOINT_KEYS = env_list("AUDIT_CHECKPOINT_KEYS", [])
# Retention (lifecycle): days of deliveries, traffic records and attribute history older
# than these are dropped, once the reports' export has covered them; at least 8 (a
# delivery is final 8 days after its event expired, Delivery.FINAL_AFTER_DAYS).
RETAIN_DAYS = env_int("RETAIN_DAYS", 90, minimum=8)
RETAIN_DAYS_BY_GROUP = {
    "deliveries": env_int("RETAIN_DAYS_DELIVERIES", RETAIN_DAYS, minimum=8),
    "traffic": env_int("RETAIN_DAYS_TRAFFIC", RETAIN_DAYS, minimum=8),
    "attributes": env_int("RETAIN_DAYS_ATTRIBUTES", RETAIN_DAYS, minimum=8),
}
# The audit log's own retention, in days: 0 keeps it for good. Entries older are removed
# once exported, and the audit chain starts after them (auditchain.services.trim_through).
AUDIT_RETAIN_DAYS = env_int("AUDIT_RETAIN_DAYS", 0, minimum=0)
RETENTION_S = env_int("RETENTION_S", 3600, minimum=60)
CELERY_BEAT_SCHEDULE = {
    "recompute-summaries": {
        "task": "broker.recompute_summaries",
        "schedule": float(SUMMARY_INTERVAL_S),
    },
    "sweep": {"task": "broker.sweep", "schedule": 5.0},
    "expire-deliveries": {"task": "broker.expire_deliveries", "schedule": 5.0},
    "expire-attributes": {"task": "broker.expire_attributes", "schedule": 5.0},
    "schedule-reports": {"task": "reports.schedule", "schedule": float(REPORTS_INTERVAL_S)},
    "sweep-reports": {"task": "reports.sweep", "schedule": 15.0},
    "link-audit-entries": {"task": "auditchain.link_entries", "schedule": float(AUDIT_LINK_S)},
    "verify-audit-log": {"task": "auditchain.verify_log", "schedule": float(AUDIT_VERIFY_S)},
    "sign-audit-checkpoint": {
        "task": "auditchain.sign_checkpoint",
        "schedule": float(AUDIT_CHECKPOINT_S),
    },
    "ensure-partitions": {"task": "lifecycle.ensure_partitions", "schedule": 600.0},
    "apply-retention": {
        "task": "lifecycle.apply_retention",
        "schedule": float(RETENTION_S),
        "options": {"queue": REPORTS_QUEUE},
    },
}

# API tokens stop working this many days after they were issued: clients' (agents log
# in with their secret again, or are given a new one) and operators' integrations'.
CLIENT_TOKEN_DAYS = env_int("CLIENT_TOKEN_DAYS", 365, minimum=1)
OPERATOR_TOKEN_DAYS = env_int("OPERATOR_TOKEN_DAYS", 90, minimum=1)

# Agents (broker/consumers.py) must log in this soon after connecting.
AGENT_LOGIN_TIMEOUT_S = env_int("AGENT_LOGIN_TIMEOUT_S", 10, minimum=1)
# Connections a web process lets wait to log in at once; beyond, a new one is told to
# try again in a few seconds (503, `busy`) rather than wait until its login times out:
# a fleet coming back after an outage is spread out instead of stampeding. A waiting
# connection costs a socket's memory; the gate also admits no more than it can log in
# within half the login time-out (broker.protocol.LoginGate).
AGENT_LOGINS_AT_ONCE = env_int("AGENT_LOGINS_AT_ONCE", 5000, minimum=1)
# How long a web process gathers its agents' attribute updates, heartbeats and presence
# before it writes them (broker.consumers): at a few a second per process each was a
# transaction of its own; gathered, a write carries dozens. Nobody waits on them but
# the agent for its answer (its time-out is 30 s). Each gathered write has a cost of its
# own (a thread's turn, a statement, a commit): with an idle fleet's heartbeats spread
# evenly, 2,000 agents cost 11.4 and 14.5 % of a core per 1,000 at 1 s, 16.1 at 0.2 s.
AGENT_REPORTS_GATHER_MS = env_int("AGENT_REPORTS_GATHER_MS", 1000, minimum=0)
# Agents confirm what they have at least this often when idle (their heartbeat). Each
# costs the server a frame each way and a statement: with 10,000 idle agents at 10 s, as
# much CPU as a round of deliveries; the idle bill's heartbeats scale with its inverse.
# A session not heard from for three of them is closed (broker.protocol.SilenceWatch):
# the web server sends no pings of its own. Under a minute, so that a proxy or load
# balancer with the common 60-s idle time-out in front of the web processes never
# closes an idle agent's connection.
AGENT_HEARTBEAT_S = env_int("AGENT_HEARTBEAT_S", 50, minimum=1)
# An agent that confirms the same position, short of its stream's end, for this long is
# sent the rest again (docs/protocol.md, "The delivery contract").
AGENT_REDELIVER_AFTER_S = env_int("AGENT_REDELIVER_AFTER_S", 5, minimum=1)
# A send from the console that would reach more receivers than this asks the operator
# to type the count before it goes.
SEND_CONFIRM_ABOVE = env_int("SEND_CONFIRM_ABOVE", 25, minimum=0)
# A session's "last seen" is written at most this often (a fleet of 100,000 heartbeating
# every AGENT_HEARTBEAT_S would otherwise write thousands of rows a second); a client
# not seen for three times this long counts as disconnected (broker.reads.presence).
PRESENCE_REFRESH_S = env_int("PRESENCE_REFRESH_S", 50, minimum=1)
if AGENT_HEARTBEAT_S >= 2 * PRESENCE_REFRESH_S:
    # Idle agents would be seen too rarely to stay within the 3x window.
    raise ConfigurationError(
        f"PRESENCE_REFRESH_S must be more than half of AGENT_HEARTBEAT_S "
        f"({AGENT_HEARTBEAT_S}), got {PRESENCE_REFRESH_S}."
    )


HEALTH_CHECK_TIMEOUT_S = env_int("HEALTH_CHECK_TIMEOUT_S", 3, minimum=1)

LOG_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"})
# The name this host's processes give on the health page (console/processes.py): the
# machine's name unless set (a container's is often meaningless).
HOST_NAME = env_str("HOST_NAME", socket.gethostname()) or socket.gethostname()

# /metrics (console/metrics.py): with PROMETHEUS_MULTIPROC_DIR, prometheus-client's
# multiprocess mode (every process of the host writes its figures there, `./run` sets
# it); it must be a folder this process can write, or nothing would be measured.
PROMETHEUS_MULTIPROC_DIR = env_str("PROMETHEUS_MULTIPROC_DIR", "")
if PROMETHEUS_MULTIPROC_DIR and not (
    Path(PROMETHEUS_MULTIPROC_DIR).is_dir() and os.access(PROMETHEUS_MULTIPROC_DIR, os.W_OK)
):
    raise ConfigurationError(
        f"PROMETHEUS_MULTIPROC_DIR must be a folder this process can write, "
        f"got {PROMETHEUS_MULTIPROC_DIR!r}."
    )

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    # A Redis or PostgreSQL outage is one warning line per process, not a traceback per
    # failure.
    "filters": {"outages": {"()": "broker.push.outages.one_line_per_outage"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["outages"]}
    },
    "root": {"handlers": ["console"], "level": env_choice("LOG_LEVEL", "INFO", LOG_LEVELS)},
    # django-axes logs every failed login at INFO; the audit log records each already.
    "loggers": {"axes": {"level": "WARNING"}},
}
