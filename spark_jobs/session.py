"""A SparkSession that behaves on a single machine: loopback only, quiet, nothing left in the cwd.

``build_session()`` must run before any JVM exists in this process for the environment settings to
apply (SPARK_LOCAL_IP, SPARK_CONF_DIR, PYSPARK_PYTHON, PYTHONPATH are read when the JVM starts). Under
``spark-submit`` the JVM is already running; the session is then taken as configured by spark-submit
plus the settings that can change at runtime.

Everything Spark writes locally (``spark.local.dir``, the warehouse, Derby's home) goes to one temporary
directory that ``stop_session()`` removes.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path

from pyspark.sql import SparkSession

PACKAGE_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = PACKAGE_DIR.parent
LOG4J2_FILE = PACKAGE_DIR / "log4j2.properties"
_FALLBACK_LOG4J2 = """rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
"""

_temp_dirs: dict[int, str] = {}
_saved_env: dict[int, dict[str, str | None]] = {}


def is_local_master(master: str | None) -> bool:
    return master is None or master == "local" or master.startswith("local[") or master.startswith("local-")


def jvm_running() -> bool:
    """True under spark-submit or once a SparkContext exists in this process."""
    from pyspark import SparkContext

    return "PYSPARK_GATEWAY_PORT" in os.environ or SparkContext._active_spark_context is not None


def _prepend_path(current: str | None, entry: str) -> str:
    parts = [p for p in (current or "").split(os.pathsep) if p]
    if entry in parts:
        return os.pathsep.join(parts)
    return os.pathsep.join([entry, *parts])


def prepare_environment(
    master: str | None, temp_root: str, env: MutableMapping[str, str] | None = None
) -> dict[str, str | None]:
    """Set what the JVM and the Python workers read at start. Returns the previous values.

    Only unset variables are filled in (SPARK_LOCAL_IP only for local masters), except PYTHONPATH, to
    which the project root is prepended so the workers can import ``spark_jobs`` and ``protocol``.
    """
    if env is None:
        env = os.environ
    previous: dict[str, str | None] = {}

    def put(name: str, value: str) -> None:
        previous.setdefault(name, env.get(name))
        env[name] = value

    if is_local_master(master) and not env.get("SPARK_LOCAL_IP"):
        put("SPARK_LOCAL_IP", "127.0.0.1")
    if not env.get("SPARK_CONF_DIR"):
        conf_dir = os.path.join(temp_root, "conf")
        os.makedirs(conf_dir, exist_ok=True)
        text = LOG4J2_FILE.read_text() if LOG4J2_FILE.is_file() else _FALLBACK_LOG4J2
        Path(conf_dir, "log4j2.properties").write_text(text)
        put("SPARK_CONF_DIR", conf_dir)
    if not env.get("PYSPARK_PYTHON"):
        put("PYSPARK_PYTHON", sys.executable)
    if not env.get("PYSPARK_DRIVER_PYTHON"):
        put("PYSPARK_DRIVER_PYTHON", sys.executable)
    put("PYTHONPATH", _prepend_path(env.get("PYTHONPATH"), str(PROJECT_ROOT)))
    return previous


def restore_environment(previous: Mapping[str, str | None]) -> None:
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def session_conf(master: str | None, temp_root: str, app_name: str = "trimq-audit") -> dict[str, str]:
    """The settings ``build_session`` applies (before the caller's ``conf`` overrides)."""
    conf = {
        "spark.app.name": app_name,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.log.level": "ERROR",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.warehouse.dir": Path(temp_root, "warehouse").as_uri(),
        "spark.local.dir": os.path.join(temp_root, "local"),
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={os.path.join(temp_root, 'derby')}",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }
    if master is not None:
        conf["spark.master"] = master
    if is_local_master(master):
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
        conf["spark.sql.shuffle.partitions"] = str(max(2, 2 * (os.cpu_count() or 1)))
    return conf


#: Settings whose values are lists of JVM options: the caller's are appended to ours, not put in their place.
JVM_OPTION_KEYS = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")


def merge_conf(base: Mapping[str, str], overrides: Mapping[str, str]) -> dict[str, str]:
    """``base`` updated with ``overrides``, except that JVM options add to ours (a user's
    ``--conf spark.driver.extraJavaOptions=...`` keeps Derby's home out of the cwd)."""
    merged = dict(base)
    for key, value in overrides.items():
        if key in JVM_OPTION_KEYS and merged.get(key):
            value = f"{merged[key]} {value}".strip()
        merged[key] = value
    return merged


#: The JVM commit-log reader's jar (spark_jobs/jvm_reader.py; ``make`` builds it).
JVM_READER_JAR = Path(__file__).with_name("jvm") / "trimq-commitlog.jar"


def jvm_reader_jar() -> str | None:
    """The built jar of the JVM commit-log reader, or None."""
    return str(JVM_READER_JAR) if JVM_READER_JAR.is_file() else None


def with_jvm_reader(settings: Mapping[str, str], jar: str | None) -> dict[str, str]:
    """``settings`` with ``jar`` (the JVM commit-log reader, when built) added to the caller's ``spark.jars``."""
    out = dict(settings)
    if jar is not None:
        out["spark.jars"] = ",".join(j for j in (out.get("spark.jars"), jar) if j)
    return out


def build_session(
    master: str | None = "local[*]",
    app_name: str = "trimq-audit",
    *,
    conf: Mapping[str, str] | None = None,
    py_files: Iterable[str] = (),
) -> SparkSession:
    """Create (or, under spark-submit, get) the SparkSession with the quiet, loopback, no-cwd settings.

    ``master`` None means "as spark-submit said" when a JVM is already running, else ``local[*]``.
    ``py_files`` are added with ``addPyFile`` (a deps zip for cluster workers, see ``build_deps_zip``).
    """
    running = jvm_running()
    if master is None and not running:
        master = "local[*]"
    temp_root = tempfile.mkdtemp(prefix="trimq-spark-")
    previous = {} if running else prepare_environment(master, temp_root)
    builder = SparkSession.builder
    settings = merge_conf(session_conf(master, temp_root, app_name), conf or {})
    if not running:  # under spark-submit the jars are its --jars
        settings = with_jvm_reader(settings, jvm_reader_jar())
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    for f in py_files:
        spark.sparkContext.addPyFile(f)
    _temp_dirs[id(spark)] = temp_root
    _saved_env[id(spark)] = previous
    return spark


def stop_session(spark: SparkSession) -> None:
    """Stop the session, remove its temporary directory and restore the environment it changed."""
    spark.stop()
    restore_environment(_saved_env.pop(id(spark), {}))
    temp_root = _temp_dirs.pop(id(spark), None)
    if temp_root:
        shutil.rmtree(temp_root, ignore_errors=True)


@atexit.register
def _cleanup() -> None:
    for temp_root in list(_temp_dirs.values()):
        shutil.rmtree(temp_root, ignore_errors=True)
    _temp_dirs.clear()


def deps_packages() -> list[str]:
    """The packages the executors import: this one (``trimq.spark_jobs``), the record codec's
    (``trimq.protocol``), named from this module's own package so the list follows a rename."""
    pkg = __package__ or "spark_jobs"
    root, _, _ = pkg.rpartition(".")
    return [pkg, f"{root}.protocol" if root else "protocol"]


def build_deps_zip(dest: str | os.PathLike[str], packages: Iterable[str] | None = None) -> str:
    """Zip the executors' code for ``--py-files`` / ``addPyFile``: every ``.py`` (and ``.properties``) of
    each package in ``packages`` (default ``deps_packages()``), stored under the package's dotted name as
    a path (``trimq/spark_jobs/parser.py``), plus the files directly in each parent package (the root
    ``trimq/__init__.py``) so the names import on the executor as they do here. The paths come from the
    imported modules, not from the checkout's layout."""
    import importlib

    dest = os.fspath(dest)
    wanted = list(deps_packages() if packages is None else packages)
    entries: dict[str, Path] = {}
    for name in wanted:
        mod = importlib.import_module(name)
        pkg_dir = Path(mod.__file__ or "").resolve().parent
        prefix = name.replace(".", "/")
        for path in sorted(pkg_dir.rglob("*")):
            if path.is_file() and path.suffix in (".py", ".properties") and "__pycache__" not in path.parts:
                entries[f"{prefix}/{path.relative_to(pkg_dir).as_posix()}"] = path
        parts = name.split(".")
        for i in range(1, len(parts)):
            parent = importlib.import_module(".".join(parts[:i]))
            parent_dir = Path(parent.__file__ or "").resolve().parent
            for path in sorted(parent_dir.iterdir()):
                if path.is_file() and path.suffix in (".py", ".typed"):
                    entries[f"{'/'.join(parts[:i])}/{path.name}"] = path
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, path in sorted(entries.items()):
            zf.write(path, arcname)
    return dest
