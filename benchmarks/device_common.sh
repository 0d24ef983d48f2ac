# Shared start and finish of the benchmarks/h200_*.sh run scripts (sourced, not run): results go to
# $R=/tmp/ragdot-results, `log` stamps a line into $R/log.txt, `finish` packs $R into $OUT (the device tool
# brings back a few files only). With RAGDOT_CACHE_DIR set before sourcing, that cache directory is made too.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
R=/tmp/ragdot-results
mkdir -p "$R" ${RAGDOT_CACHE_DIR:+"$RAGDOT_CACHE_DIR"}
log() { echo "== $(date +%T) $*" | tee -a "$R/log.txt"; }
finish() {
  log "done"
  tar czf "$OUT/results.tgz" -C "$R" .
  cp "$R/log.txt" "$OUT/log.txt"
}
