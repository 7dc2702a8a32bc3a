# Sourced by Spark's launch scripts (spark-class: the master, the worker and spark-submit) before
# the JVM starts, with every assignment exported (bin/load-spark-env.sh).
#
# SPARK_AUTH_SECRET (from .env) becomes _SPARK_AUTH_SECRET, the variable Spark reads the RPC secret
# from, and is removed under its own name: the secret stays in the environment of the JVM and its
# children (a worker hands it to its executors the same way), out of every argument list and
# setting. An empty, short or change-me value refuses to start, like minio-init's check of
# pipeline_lib/secret_check.py's placeholders; the message names the variable, never the value.
case "${SPARK_AUTH_SECRET:-}" in
  ""|*[Cc][Hh][Aa][Nn][Gg][Ee][-_][Mm][Ee]*|*[Cc][Hh][Aa][Nn][Gg][Ee][Mm][Ee]*)
    echo "spark-env.sh: refusing to start: SPARK_AUTH_SECRET is empty or a change-me placeholder; set it in .env, generated with python -c 'import secrets; print(secrets.token_urlsafe(32))'" >&2
    exit 1;;
esac
if [ "${#SPARK_AUTH_SECRET}" -lt 32 ]; then
  echo "spark-env.sh: refusing to start: SPARK_AUTH_SECRET is shorter than 32 characters; generate it with python -c 'import secrets; print(secrets.token_urlsafe(32))'" >&2
  exit 1
fi
_SPARK_AUTH_SECRET="${SPARK_AUTH_SECRET}"
unset SPARK_AUTH_SECRET
