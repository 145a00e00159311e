#!/usr/bin/env bash
# Issue 26, run 5: placement over two Ray nodes started on one host, so the node-spanning placement and
# weight-sync code runs as on a cluster: `ray start --head` on GPUs 0..G/2-1 (node IP 127.0.0.1) and
# `ray start --address` on GPUs G/2..G-1 (node IP 127.0.0.2), then GRPO (bench/grpo_ray.py, random SmolLM2
# weights, cluster.ray_address) disaggregated (G/2 trainers + G/2 engines: trainers and engines on different
# nodes, weight sync by NCCL broadcast across them) and colocated (cluster.actor_num_nodes=2, G trainers and
# G engines spread over both). $GPUS defaults to 4. Device kind: nvidia-h200-x4 (x2 with GPUS=2); Ray
# installed (scripts/device_setup.sh), carry .device. Output: $OUT/two_nodes/results.jsonl, $OUT/two_nodes_*.log
# (the table row, where each trainer and engine was placed). Both Ray nodes are stopped at the end (their
# process groups only). DRY_RUN=1: CPU nodes of 2 CPUs each and bundles of 2 CPUs (so each node takes one):
# `di` 1 trainer + 1 engine, `co` 2 trainers + 2 colocated engines (cluster.actor_num_nodes=2), gloo, a tiny model.
source "$(dirname "$0")/multi_common.sh"
G=${GPUS:-4}
need_gpus "$G"; need_ray
H=$(( G / 2 ))
RAY=$(dirname "$(command -v "$PY")")/ray
[[ -x $RAY ]] || RAY=ray
PORT=${RAY_PORT:-6390}
# its own temp dir: a plain ray.init() elsewhere on this host (which reads /tmp/ray/ray_current_cluster)
# does not find these nodes and join them
RTMP=/tmp/mray$PORT
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}  # one host, loopback addresses: no token to hand between nodes
if [[ $DRY == 1 ]]; then
  NODE=(--num-cpus=2 --num-gpus=0)
  GPUS_A="" GPUS_B=""
  ARGS_DI="--trainers 1 --engines 1" ARGS_CO="--colocate --nodes 2 --trainers 2 --engines 2"
  EXTRA=(--tiny --length 16 --seqs 4 --n 2 --steps 2 train.device=cpu cluster.weight_sync_bucket_mb=1)
  EXTRA_DI=(cluster.num_cpus_per_worker=2) EXTRA_CO=(cluster.num_cpus_per_worker=2)
  ROWS=${ROWS:-di co}
else
  NODE=(--num-cpus=$(( $(nproc) / 2 )) --num-gpus=$H)
  GPUS_A=$(seq -s, 0 $(( H - 1 ))) GPUS_B=$(seq -s, $H $(( G - 1 )))
  ARGS_DI="--trainers $H --engines $H" ARGS_CO="--colocate --nodes 2 --trainers $G --engines $G"
  EXTRA=(--length "${LENGTH:-1024}" --seqs 256 --steps "${STEPS:-3}")
  EXTRA_DI=() EXTRA_CO=()
fi
PGIDS=()
stop_nodes() { for p in "${PGIDS[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done; sleep 3
               for p in "${PGIDS[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done; }
trap stop_nodes EXIT
CUDA_VISIBLE_DEVICES=$GPUS_A setsid "$RAY" start --head --port="$PORT" --node-ip-address=127.0.0.1 --temp-dir="$RTMP" \
    --include-dashboard=false --dashboard-agent-listen-port=$(( PORT + 1 )) "${NODE[@]}" --block \
    > "$OUT/ray_head.log" 2>&1 &
PGIDS+=($!)
sleep 8
CUDA_VISIBLE_DEVICES=$GPUS_B setsid "$RAY" start --address=127.0.0.1:"$PORT" --node-ip-address=127.0.0.2 --temp-dir="$RTMP" \
    --dashboard-agent-listen-port=$(( PORT + 2 )) "${NODE[@]}" --block > "$OUT/ray_node2.log" 2>&1 &
PGIDS+=($!)
$PY - "$PORT" <<'PY' || { tail -n 20 "$OUT"/ray_*.log; exit 5; }
import sys, time, ray
ray.init(address=f"127.0.0.1:{sys.argv[1]}", log_to_driver=False)
for _ in range(60):
    alive = [n for n in ray.nodes() if n["Alive"]]
    if len(alive) >= 2:
        break
    time.sleep(2)
print("ray nodes:", [(n["NodeManagerAddress"], n["Resources"].get("GPU", 0), n["Resources"].get("CPU")) for n in alive])
sys.exit(0 if len(alive) >= 2 else 1)
PY
rc=0
for r in ${ROWS:-di co}; do
  if [[ $r == di ]]; then a=$ARGS_DI x=("${EXTRA_DI[@]}"); else a=$ARGS_CO x=("${EXTRA_CO[@]}"); fi
  mem_start "two_nodes_$r"
  $PY bench/grpo_ray.py --arch smollm2 --name "$r" $a "${EXTRA[@]}" --tokenizer "$TOK" \
      --output-dir "$OUT/two_nodes" cluster.ray_address=127.0.0.1:"$PORT" "${x[@]}" > "$OUT/two_nodes_$r.full.log" 2>&1
  rc=$(( rc | $? ))
  { grep -E "ray placement|^\| |Error|error" "$OUT/two_nodes_$r.full.log" | tail -6; mem_stop; } | tee "$OUT/two_nodes_$r.log"
done
exit $rc
