# One image for every service of docker-compose.yml: the sharecoord daemon, the Spark
# master and worker, and the one-shot compaction and audit jobs.
#
# The base image's Spark must be the Spark of the pinned pyspark (pyproject.toml): the
# jobs' driver (sharecoord compact/audit) and the executors (the worker) run the same
# Spark, and the same Python (3.10 on Ubuntu 22.04) runs the driver and the executors.
FROM apache/spark:4.0.3-scala2.13-java17-python3-ubuntu

USER root
WORKDIR /opt/sharecoord
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY persistence ./persistence
COPY server ./server
COPY client ./client
COPY spark_jobs ./spark_jobs
# The spark extra, as the one-shot jobs run from this image: it also installs
# pyspark==4.0.3 from PyPI (pyproject.toml pins it), a second copy of the Spark 4.0.3
# jars beside /opt/spark, kept on purpose so the image installs exactly what
# pyproject.toml says. `sharecoord compact` runs that pyspark's bin/spark-submit, which
# runs the Spark of $SPARK_HOME=/opt/spark (the same version). The postgres extra: the
# nodes of the cluster profile run on the PostgreSQL store.
RUN python3 -m pip install --no-cache-dir '.[spark,postgres]' \
    && rm -rf /opt/sharecoord \
    && mkdir -p /data /var/cache/sharecoord/spark-classes \
    && chown spark:spark /data /var/cache/sharecoord/spark-classes

# Executors start this Python; for local masters `sharecoord` sets it to its own. The
# one-shot jobs' driver JVM keeps the classes it loads where docker-compose.yml mounts a
# volume (a new volume takes this directory's owner): their next runs map them.
ENV PYSPARK_PYTHON=python3 \
    PYSPARK_DRIVER_PYTHON=python3 \
    SHARECOORD_SPARK_CLASS_CACHE=/var/cache/sharecoord/spark-classes

USER spark
WORKDIR /opt/spark/work-dir
VOLUME ["/data"]
# 9095 the daemon; 7077 and 8080 the Spark master; 8081 the Spark worker's UI.
EXPOSE 9095 7077 8080 8081
CMD ["sharecoord", "serve", "--listen", "0.0.0.0:9095", "--data-dir", "/data"]
