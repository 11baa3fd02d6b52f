"""A commit-log reader in the JVM, built for the audit benchmark only (issue 21): how fast Spark reads the commit
log when no Python worker and no Arrow-to-row conversion stand in between.

``CommitLogPrototype.java`` reads clean stores (every record a message of IPv4 hosts, each segment ending in the
filler or zeros) and refuses anything else with an error. ``bench.spark_bench`` compiles it against the pyspark
package's own jars, checks that it gives the data source's rows on its warm-up store, and times it beside the data
source. It is not the data source: an audit must read what is broken too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

PROVIDER = "org.trimq.bench.CommitLogPrototype"
SOURCE = Path(__file__).with_name("CommitLogPrototype.java")


def javac() -> str:
    """The Java compiler: ``$JAVA_HOME/bin/javac``, else the one on PATH. RuntimeError naming what is missing."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "javac").is_file():
        return str(Path(home) / "bin" / "javac")
    found = shutil.which("javac")
    if found is None:
        raise RuntimeError("no javac (a JDK, not only a JRE) in $JAVA_HOME/bin or on PATH")
    return found


def build_jar(dest: Path) -> Path:
    """Compile the prototype against pyspark's jars into ``dest/trimq-bench-jvm-reader.jar``; returns its path."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    dest.mkdir(parents=True, exist_ok=True)
    jar = dest / "trimq-bench-jvm-reader.jar"
    with tempfile.TemporaryDirectory(prefix="trimq-jvm-reader-") as classes:
        subprocess.run([javac(), "-nowarn", "-d", classes, "-cp", f"{jars}/*", str(SOURCE)], check=True,
                       capture_output=True, text=True)
        jar_tool = Path(javac()).with_name("jar")
        subprocess.run([str(jar_tool), "cf", str(jar), "-C", classes, "."], check=True, capture_output=True)
    return jar
