#!/usr/bin/env bash
# Runs on the GPU machine from the repository root after tools/stage_device.sh: the GPU tests,
# then the benchmarks named in $SUITE (tests, nccl, gpupipe, train, multi, equiv, overlap-eq,
# fault, multi-b, multi-b2 (ONLY=regex picks its runs), transfer, capacity, recipes, mtp, vocab, preflight, ab (AB="binaries"), ab1 (one GPU, AB="binaries", AB_SHAPES="a b c d"), defer, expert-gemm, lanes (LANES="1 2 4 8"), repeat, scale-equiv, scale-b (all GPUs), hf, hf-par, tok, prof-a, prof-b, attn, attn-pick, docmask, bench-a, bench-b, peer-a, peer-b, c, d, offload),
# logs under $OUT (the device tool's output folder).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
SUITE=${SUITE:-tests train}
mkdir -p /tmp/devlib && tar -C /tmp/devlib -xJf devrun/lib.tar.xz
export LD_LIBRARY_PATH=/tmp/devlib/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=devrun/bin
# NCCL: the system's, else the one PyTorch's wheels carry.
if ! ldconfig -p | grep -q libnccl.so.2 && [ ! -e /usr/local/cuda/lib64/libnccl.so.2 ]; then
  nccl=$(find / -name libnccl.so.2 -not -path "/proc/*" 2>/dev/null | head -1)
  [ -n "$nccl" ] && export LD_LIBRARY_PATH=$(dirname "$nccl"):$LD_LIBRARY_PATH
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
SHAPE_A="--num-experts 0 --num-layers 12 --hidden-size 768 --num-attention-heads 12 --num-query-groups 12 --ffn-hidden-size 2048 --vocab-size 50304 --seq-length 1024 --micro-batch-size 8 --num-microbatches 4"
# Shape (c): fine-grained MoE (128 experts of width 768, top-8) with Qwen3's attention (head dim
# 128, q/k norms), a Qwen3-MoE-like model; global batch 8 of one sequence each.
SHAPE_C="--num-layers 4 --hidden-size 2048 --num-attention-heads 32 --num-query-groups 4 --num-experts 128 --moe-router-topk 8 --ffn-hidden-size 768 --vocab-size 151936 --seq-length 4096 --micro-batch-size 1 --kv-channels 128 --qk-layernorm"
SHAPE_B="--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --num-query-groups 8 --num-experts 8 --moe-router-topk 2 --ffn-hidden-size 2816 --vocab-size 32000 --seq-length 2048 --micro-batch-size 2 --num-microbatches 8"
# Shape (d): Moonlight-like DeepSeek-V3 layers (the "d" run below says more).
SHAPE_D="--num-layers 4 --hidden-size 2048 --num-attention-heads 16 --multi-latent-attention --qk-layernorm --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128 --rotary-interleaved --num-experts 64 --moe-router-topk 6 --moe-ffn-hidden-size 1408 --moe-shared-expert-intermediate-size 2816 --ffn-hidden-size 11264 --moe-layer-freq [0,1,1,1] --moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-topk-scaling-factor 2.446 --moe-aux-loss-coeff 0 --vocab-size 163840 --seq-length 4096 --micro-batch-size 1"
# Balanced routing for benchmarks: Megatron-LM's random router logits
# (--moe-router-force-load-balancing, Note [Forced load balancing] in
# src/model/attention_node.cc) spread the rows about evenly; padded to a capacity of
# ceil(N k / E) every expert, and so every expert rank, gets exactly the same rows.
BALANCED="--moe-router-force-load-balancing --moe-expert-capacity-factor 1 --moe-pad-expert-input-to-capacity"
# One line from a --log-json file: medians over the steps after the third.
summary() {
  python3 -c "
import json,statistics as s
r=[json.loads(l) for l in open('$1')][3:]
m=lambda k: s.median(x[k] for x in r) if k in r[0] else -1
gib=lambda v: [round(b/2**30,2) for b in (v if isinstance(v,list) else [v])]
print('tokens/s', round(m('tokens_per_s')), 'peak GiB', gib(r[-1]['mem_peak_bytes']), 'act GiB', gib(r[-1]['activation_peak_bytes']), 'a2a ms', round(1e3*m('alltoall_s'),2), 'exposed ms', round(1e3*m('exposed_alltoall_s'),2), 'by rank a2a/exposed ms', [(round(1e3*s.median(x['alltoall_s_by_rank'][p] for x in r),1), round(1e3*s.median(x['exposed_alltoall_s_by_rank'][p] for x in r),1)) for p in range(len(r[0].get('alltoall_s_by_rank',[])))], 'waiting ms', [round(1e3*s.median(x['exposed_alltoall_waiting_s_by_rank'][p] for x in r),1) for p in range(len(r[0].get('exposed_alltoall_waiting_s_by_rank',[])))], 'exposed %', [round(100*s.median(x['exposed_alltoall_s_by_rank'][p] for x in r)/max(1e-12, s.median(x['alltoall_s_by_rank'][p] for x in r)),1) for p in range(len(r[0].get('alltoall_s_by_rank',[])))], 'fb ms', round(1e3*m('forward_backward_s'),2), 'step ms', round(1e3*m('step_seconds'),2), 'rows max/mean step, mb median, mb max', [round(s.median(x['expert_rows_max_over_mean'][k] for x in r),3) for k in ('step','microbatch_median','microbatch_max')] if 'expert_rows_max_over_mean' in r[0] else '-')" 2>&1
}
G=$(nvidia-smi -L 2>/dev/null | wc -l)
# tandem_runs SHAPE RANKS LIMIT_S TMPDIR OUTFILE "name options..." ...: tandem train on the shape
# for $STEPS steps (default 7; the summary takes medians from the fourth on: more steps settle
# effects of a few percent), under mpirun with RANKS ranks (the run named one-gpu: one process),
# each run's summary line appended to $OUT/OUTFILE; ONLY=regex picks runs by name.
tandem_runs() {
  local shape=$1 ranks=$2 limit=$3 tmp=$4 out=$5 run name launch n; shift 5
  for run in "$@"; do
    set -- $run; name=$1; shift
    [[ $name =~ ${ONLY:-.} ]] || continue
    n=$ranks; launch="mpirun --allow-run-as-root --oversubscribe ${MPI_EXTRA:-} -np $n -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH"
    [ $name = one-gpu ] && n=1 && launch=""
    timeout $limit $launch ${TANDEM:-$B/tandem} train --device cuda $shape "$@" --train-iters ${STEPS:-7} --log-interval 1 --quiet --log-json $tmp/$name.jsonl > $tmp/$name.log 2>&1
    echo "tandem $name ($n GPUs) rc=$? $(summary $tmp/$name.jsonl)" | tee -a "$OUT/$out"
    python3 -c "import json,sys;[print('  iter', r['iter'], r['note']) for r in map(json.loads, open(sys.argv[1])) if 'note' in r]" $tmp/$name.jsonl 2>/dev/null | tee -a "$OUT/$out"
    [ -s $tmp/$name.jsonl ] || tail -5 $tmp/$name.log
  done
}
# peer_runs SHAPE RANKS LIMIT_S TMPDIR OUTFILE: torch_peer.py's pp schedules and ep mode beside
# them (PEERS=0 skips them; PEER_MODES="mode;mode" picks some).
peer_runs() {
  local shape=$1 ranks=$2 limit=$3 tmp=$4 out=$5 m modes
  [ "${PEERS:-1}" = 0 ] && return
  IFS=';' read -ra modes <<< "${PEER_MODES:-pp --schedule 1F1B --compile;pp --schedule Interleaved1F1B --compile;pp --schedule DualPipeV;ep}"
  for m in "${modes[@]}"; do
    timeout $limit torchrun --nproc-per-node $ranks devrun/torch_peer.py --mode $m $shape --num-microbatches 8 --steps 6 --warmup-steps 3 2> $tmp/peer.err | grep RESULT | tee -a "$OUT/$out"
  done
}
for s in $SUITE; do
  echo "== $s $(date +%T)"
  case $s in
    tests)
      # Logs stay in /tmp (the device tool brings back only a few files); failures are printed.
      timeout 300 $B/test_cuda_allocator > /tmp/test_cuda_allocator.log 2>&1; echo "allocator rc=$?"
      timeout 300 $B/test_cuda_ops > /tmp/test_cuda_ops.log 2>&1; echo "ops rc=$?"
      for t in test_cuda_memory test_cuda_hf; do
        [ -x $B/$t ] && { timeout 300 $B/$t > /tmp/$t.log 2>&1; echo "$t rc=$?"; }
      done
      grep -E "^(layer|dense|MoE|Qwen|DeepSeek|offload|[a-z0-9_]+: transformers)" /tmp/test_cuda_*.log | tee "$OUT/tests_figures.txt"
      grep -E "FAILED|PASSED" /tmp/test_cuda_*.log | tail -20
      grep -h -B2 -A12 "Failure$" /tmp/test_cuda_*.log | head -80 ;;
    tok)
      # tandem convert with the model's own tokenizers against Python's sentencepiece and
      # tokenizers, every id of >= 1 MB of real text (tests/python/check_tokenize.py); needs no
      # GPU, only those packages. Writes the tokenizer.json it trained to $OUT (a fixture to
      # commit).
      timeout 400 python3 tests/python/check_tokenize.py --tandem $B/tandem --work /tmp/tok --out "$OUT" 2> /tmp/tok.err | tee "$OUT/tok.txt"
      grep -E -A8 "Traceback|Error" /tmp/tok.err | tail -20 ;;
    vocab)
      # Megatron-LM's vocabulary and end-of-document id of each --tokenizer-type against the
      # tokenizers' own Python libraries and transformers' AutoTokenizer (needs no GPU).
      timeout 200 python3 devrun/check_tokenizer_vocab.py --tandem $B/tandem --work /tmp/vocab --spm devrun/spm.model 2>&1 | tail -8 | tee "$OUT/vocab.txt" ;;
    tb)
      # Validation and TensorBoard on the GPU: event files read back with tensorboard's own
      # reader (tests/python/check_tensorboard.py), and validation runs changing no training
      # loss (the fused loss node must form no gradient in an evaluation).
      T=/tmp/tb; rm -rf $T; mkdir -p $T
      timeout 200 $B/tandem train --device cuda --train-iters 20 --log-interval 5 --eval-interval 10 --eval-iters 2 --tensorboard-dir $T/run --log-json $T/run.jsonl --quiet > $T/run.log 2>&1; echo "train rc=$?"; tail -2 $T/run.log
      timeout 120 python3 tests/python/check_tensorboard.py $T/run --steps 20 --valid-steps 2 --log-json $T/run.jsonl 2>&1 | tail -5 | tee -a "$OUT/tb.txt"
      timeout 200 $B/tandem train --device cuda --train-iters 6 --quiet --log-json $T/a.jsonl > /dev/null 2>&1
      timeout 200 $B/tandem train --device cuda --train-iters 6 --quiet --eval-interval 2 --eval-iters 2 --log-json $T/b.jsonl > /dev/null 2>&1
      python3 -c "import json;L=lambda f:[json.loads(l)['loss'] for l in open(f) if 'loss' in json.loads(l)];a,b=L('$T/a.jsonl'),L('$T/b.jsonl');print('validation changes no training loss:', a==b, len(a), a[-1:], b[-1:])" 2>&1 | tee -a "$OUT/tb.txt" ;;
    demo)
      # make demo's training on the GPU (the Makefile's own DEMO_* options), timed, and its
      # held-out accuracy.
      A=$(make -s --no-print-directory --eval 'demo-args: ; @echo --addition-max-digits $(DEMO_DIGITS) $(DEMO_MODEL) $(DEMO_ARGS)' demo-args)
      rm -rf /tmp/demo; mkdir -p /tmp/demo; t0=$(date +%s.%N)
      timeout 400 $B/tandem train --device cuda $A --save /tmp/demo/model --quiet --log-json /tmp/demo/log.jsonl > /tmp/demo.log 2>&1
      echo "demo on the GPU: rc=$? $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s (start-up included)" | tee -a "$OUT/demo.txt"; tail -2 /tmp/demo.log
      $B/tandem generate --load /tmp/demo/model --max-digits $(make -s --no-print-directory --eval 'd: ; @echo $(DEMO_DIGITS)' d) | tail -1 | tee -a "$OUT/demo.txt" ;;
    models)
      timeout 300 $B/test_cuda_ops --gtest_filter='CudaModel.*' > /tmp/models.log 2>&1; echo "CudaModel rc=$?"; grep -E "OK \]|FAILED|Failure" -A3 /tmp/models.log | head -30 ;;
    b1)
      # Shape (b) on one GPU, one process, micro-batch 2: the figure to hold the trainer to
      # (bench/results/gpu_single.md records it per micro-batch size).
      timeout 300 $B/tandem train --device cuda ${SHAPE_B/--num-microbatches 8/} --mock-data --global-batch-size 16 --train-iters ${STEPS:-8} --log-interval 1 --quiet --log-json /tmp/b1.jsonl > /tmp/b1.log 2>&1
      echo "tandem b one-gpu rc=$? $(summary /tmp/b1.jsonl)" | tee -a "$OUT/b1.txt"; tail -2 /tmp/b1.log ;;
    transfer)
      # Note [Node times at another shape] (src/planner/node_scaling.cc): shape (b)'s node
      # times measured once, at micro-batch 2, by one process without mpirun; `tandem plan` from
      # that one file at micro-batch 1, 4, 8 and at 6, 12, 16 layers, each beside a short
      # measured run (8 micro-batches a step; tokens/s the median of the steps after the third,
      # "best" the fastest step). Beside the plan (the fixed part of a node fitted from the file,
      # "o us", and the GPU's idle time before each node phase as measured, "gap us", after
      # Note [Gaps between nodes] in src/planner/pipeline_model.cc), two others from the same
      # file: "proportional" (node_overhead_s 0: every node in proportion to its work) and "as
      # measured" (without measured_at: the times as they are, the planner before the scaling).
      T=/tmp/transfer; rm -rf $T; mkdir -p $T
      MODEL_B=$(echo "$SHAPE_B" | sed 's/--num-layers 8 //; s/ --micro-batch-size.*//')
      steps="--mock-data --train-iters ${STEPS:-8} --log-interval 1 --quiet"
      timeout 150 $B/tandem train --device cuda $MODEL_B --num-layers 8 --micro-batch-size 2 --global-batch-size 16 $steps --log-json $T/cal.jsonl --node-times-out $T/nodes.json > $T/cal.log 2>&1
      echo "calibration, micro-batch 2, 8 layers, no mpirun: rc=$? $(summary $T/cal.jsonl)" | tee -a "$OUT/transfer.txt"; tail -2 $T/cal.log
      cp $T/nodes.json "$OUT/transfer_nodes.json"
      python3 -c "
import json,sys
j=json.load(open(sys.argv[1])); j['node_overhead_s']=0; json.dump(j,open(sys.argv[2],'w'))
del j['node_overhead_s'], j['measured_at']; json.dump(j,open(sys.argv[3],'w'))" $T/nodes.json $T/prop.json $T/bare.json
      tps() { $B/tandem plan --device cuda $1 --node-times $2 --json 2>> $T/plan.err | python3 -c "import json,sys;j=json.load(sys.stdin);print(round(j['tokens_per_s']), round(1e6*j.get('node_overhead_s',0),1), round(1e6*j.get('node_gap_s',0),2))" 2>/dev/null || echo "- - -"; }
      printf '%-15s %9s %9s %9s %7s %12s %7s %12s %7s %8s %8s\n' "micro-batch, L" planned measured best error proportional error "as measured" error "o us" "gap us" | tee -a "$OUT/transfer.txt"
      for row in "2 8" "1 8" "4 8" "8 8" "2 6" "2 12" "2 16"; do
        set -- $row; run="$MODEL_B --num-layers $2 --micro-batch-size $1 --global-batch-size $((8 * $1))"; name="$1, $2"
        read planned o gap < <(tps "$run" $T/nodes.json); read prop _ _ < <(tps "$run" $T/prop.json); read bare _ _ < <(tps "$run" $T/bare.json)
        timeout 150 $B/tandem train --device cuda $run $steps --log-json $T/r.jsonl > $T/r.log 2>&1 || tail -3 $T/r.log
        python3 -c "
import json,statistics as st,sys
r=[json.loads(l)['tokens_per_s'] for l in open(sys.argv[1])][3:]
m=st.median(r); p,q,b=sys.argv[3:6]
e=lambda x: '%+.1f%%' % (100*(float(x)/m-1)) if x!='-' else '-'
print('%-15s %9s %9d %9d %7s %12s %7s %12s %7s %8s %8s' % (sys.argv[2], p, m, max(r), e(p), q, e(q), b, e(b), sys.argv[6], sys.argv[7]))" $T/r.jsonl "$name" "$planned" "$prop" "$bare" "$o" "$gap" 2>&1 | tee -a "$OUT/transfer.txt"
      done
      # Node times measured at micro-batch 8 too, to set beside the scaled ones node by node.
      timeout 150 $B/tandem train --device cuda $MODEL_B --num-layers 8 --micro-batch-size 8 --global-batch-size 64 $steps --log-json $T/cal8.jsonl --node-times-out "$OUT/transfer_nodes_mb8.json" > $T/cal8.log 2>&1
      echo "node times at micro-batch 8: rc=$? $(summary $T/cal8.jsonl)" | tee -a "$OUT/transfer.txt"
      [ -s $T/plan.err ] && head -5 $T/plan.err ;;
    c)
      # Shape (c) on one GPU, tandem beside the peer (torch_peer.py with --kv-channels and
      # --qk-layernorm) under torch.compile in the same call; the bf16 matrix rate measured first
      # and the experts' products' rate from the run's node times (6 R H F FLOPs a layer).
      python3 -c "
import torch,time
a=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16);b=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16)
for _ in range(3): a@b
torch.cuda.synchronize();t=time.time()
for _ in range(20): a@b
torch.cuda.synchronize();print('bf16 matmul 8192^3 TFLOP/s', round(20*2*8192**3/(time.time()-t)/1e12,1))" | tee -a "$OUT/c.txt"
      for v in ${C_RUNS:-qwen3-attention head-dim-64}; do
        SH="$SHAPE_C"; [[ $v =~ ^head-dim-64 ]] && SH="${SHAPE_C/--kv-channels 128 --qk-layernorm/}"
        # NAME-lanesN: the experts' products on N lanes (Note [Lanes]); NAME-grouped=PHASES: the
        # phases run as grouped calls (Note [Grouped expert products]; "none": all on lanes).
        L=4; [[ $v =~ -lanes([0-9]+)$ ]] && L=${BASH_REMATCH[1]}
        GR=""; [[ $v =~ -grouped=([a-z,]+)$ ]] && GR=${BASH_REMATCH[1]}
        t0=$(date +%s)
        timeout 300 $B/tandem train --expert-lanes $L ${GR:+--expert-grouped $GR} --device cuda $SH --global-batch-size 8 --mock-data --train-iters ${STEPS:-8} --log-interval 1 --quiet --log-json /tmp/c_$v.jsonl --node-times-out /tmp/c_$v.nodes.json > /tmp/c_$v.log 2>&1
        echo "tandem $v rc=$? ($(( $(date +%s) - t0 )) s) $(summary /tmp/c_$v.jsonl)" | tee -a "$OUT/c.txt"; tail -2 /tmp/c_$v.log
        python3 -c "
import json;n=json.load(open('/tmp/c_$v.nodes.json'))['nodes']['experts']
R,H,F=4096*8,2048,768;fl=6*R*H*F
print('  experts node (per layer, micro-batch; 6 R H F FLOPs each phase): forward %.2f ms %.0f TFLOP/s, backward input %.2f ms %.0f TFLOP/s, weight %.2f ms %.0f TFLOP/s'%(n['forward']*1e3,fl/n['forward']/1e12,n['backward_input']*1e3,fl/n['backward_input']/1e12,n['backward_weight']*1e3,fl/n['backward_weight']/1e12))
for k,v in json.load(open('/tmp/c_$v.nodes.json'))['nodes'].items(): print('  node', k, ' '.join('%s %.3f ms'%(p,t*1e3) for p,t in v.items() if isinstance(t,(int,float))))" 2>&1 | tee -a "$OUT/c.txt"
      done
      cp /tmp/c_qwen3-attention.nodes.json "$OUT/c_nodes.json" 2>/dev/null
      [ "${PEERS:-1}" = 0 ] && continue
      PSH="${SHAPE_C/--micro-batch-size 1/--micro-batch-size 1 --num-microbatches 8}"
      timeout 500 python3 devrun/torch_peer.py --mode single --compile $PSH --steps 6 --warmup-steps 3 2> /tmp/peer_c.err | grep RESULT | tee -a "$OUT/c.txt"; tail -2 /tmp/peer_c.err ;;
    offload)
      # Note [Activation offload] on one GPU: shape (c)'s widths at sequence 4096, micro-batch
      # $OFF_MB (default 8; global batch two micro-batches). For each of no offload and
      # --offload-activations $OFF_KINDS, the most layers whose planned peak fits $OFF_LIMIT_GIB
      # GiB (OFF_LIMIT_GIB, default 130), trained $STEPS steps: measured against planned peaks (device,
      # activations, host), tokens/s. Then the plain run's layers with offload: the peak drop
      # against the plan's, the step time, and the last step's trace (the copies' overlap).
      T=/tmp/offload; rm -rf $T; mkdir -p $T
      mb=${OFF_MB:-8}; kinds=${OFF_KINDS:-attention,experts,combine}; limit=${OFF_LIMIT_GIB:-130}
      BASE=$(echo "$SHAPE_C" | sed 's/--num-layers 4 //; s/--micro-batch-size 1//')
      run_of() { echo "$BASE --num-layers $1 --micro-batch-size $mb --global-batch-size $((2 * mb)) $2"; }
      fits() { $B/tandem plan --device cuda $(run_of $1 "$2") --mock-data --json 2>/dev/null | python3 -c "import json,sys;r=json.load(sys.stdin)['ranks'][0];print('yes' if r['peak_bytes'] <= $limit * 2**30 else '')" 2>/dev/null; }
      most() { local L=2 best=0; while [ $L -le 40 ]; do [ -n "$(fits $L "$1")" ] && best=$L || break; L=$((L + 1)); done; echo $best; }
      report() { python3 -c "
import json,statistics as st,sys
r=[json.loads(l) for l in open(sys.argv[1])][1:]
g=lambda k: (lambda v: v[0] if isinstance(v, list) else v)(r[-1].get(k, 0))
print(sys.argv[2], 'tokens/s', round(st.median(x['tokens_per_s'] for x in r)), 'peak GiB measured/planned %.3f/%.3f' % (g('mem_peak_bytes')/2**30, g('planned_peak_bytes')/2**30), 'activations GiB %.3f/%.3f' % (g('activation_peak_bytes')/2**30, g('planned_activation_peak_bytes')/2**30), 'host GiB %.3f/%.3f' % (g('offload_host_peak_bytes')/2**30, g('planned_offload_host_peak_bytes')/2**30), 'equal' if g('activation_peak_bytes')==g('planned_activation_peak_bytes') and g('offload_host_peak_bytes')==g('planned_offload_host_peak_bytes') else 'DIFFER')" "$@" 2>&1; }
      Lp=$(most ""); Lo=$(most "--offload-activations $kinds")
      echo "micro-batch $mb, limit $limit GiB: most layers planned to fit: $Lp without offload, $Lo with --offload-activations $kinds" | tee -a "$OUT/offload.txt"
      echo "plan of $Lo layers without offload: peak $($B/tandem plan --device cuda $(run_of $Lo "") --mock-data --json 2>/dev/null | python3 -c "import json,sys;print(round(json.load(sys.stdin)['ranks'][0]['peak_bytes']/2**30,2),'GiB')")" | tee -a "$OUT/offload.txt"
      steps="--mock-data --train-iters ${STEPS:-4} --log-interval 1 --quiet $BALANCED"
      for row in "$Lp|" "$Lo|--offload-activations $kinds" "$Lp|--offload-activations $kinds"; do
        L=${row%%|*}; opt=${row#*|}; name="layers $L ${opt:-no offload}"
        tr=""; [ "$L" = "$Lp" ] && [ -n "$opt" ] && tr="--trace $T/trace.json"
        timeout 400 $B/tandem train --device cuda $(run_of $L "$opt") $steps --log-json $T/r.jsonl $tr > $T/r.log 2>&1 || tail -3 $T/r.log
        report $T/r.jsonl "$name:" | tee -a "$OUT/offload.txt"
        [ "$L" = "$Lp" ] && cp $T/r.jsonl "$T/losses_${opt:+offload}.jsonl"
      done
      python3 -c "
import json,sys
a,b=[[json.loads(l)['loss'] for l in open(f)] for f in sys.argv[1:3]]
print('losses of $Lp layers without / with offload:', a, b, 'bitwise equal' if a==b else 'DIFFER')" $T/losses_.jsonl $T/losses_offload.jsonl 2>&1 | tee -a "$OUT/offload.txt"
      [ -f $T/trace.json ] && python3 - $T/trace.json <<'PY' | tee -a "$OUT/offload.txt"
import json, sys
ev = [e for e in json.load(open(sys.argv[1])).get("traceEvents", []) if e.get("ph") == "X"]
def spans(prefix): return [e for e in ev if e.get("name", "").startswith(prefix)]
out, back, waits = spans("offload "), spans("reload "), spans("wait reload")
ms = lambda v: sum(e["dur"] for e in v) / 1e3
print("last step's trace: %d copies out (%.1f ms), %d copies back (%.1f ms), %d waits for a copy back (%.1f ms)" % (len(out), ms(out), len(back), ms(back), len(waits), ms(waits)))
PY
      ;;
    d)
      # Shape (d): Moonlight-like DeepSeek-V3 layers (multi-head latent attention, 64 experts of
      # width 1408 top-6 with two shared, the sigmoid router with its expert bias, the first layer
      # dense) on one GPU, tandem beside transformers' DeepseekV3ForCausalLM under torch.compile
      # (bench/hf_peer.py) in the same call; the MFU of both by hf_peer.py's FLOP formula against
      # the chip's measured bf16 matrix rate and the datasheet's 989 TFLOP/s; then the planner's
      # prediction from this run's node times for EP2 combined 1F1B on two GPUs.
      # Twice: each micro-batch's own expert weight gradients, then the step's 8 in one product
      # per expert (--moe-wgrad-merge 8, Note [Merged expert weight gradients]); the EP2 plans
      # from each run's node times.
      for merge in ${D_MERGES:-1 8}; do
      t0=$(date +%s)
      timeout 300 $B/tandem train --device cuda $SHAPE_D --moe-wgrad-merge $merge --global-batch-size 8 --mock-data --train-iters ${STEPS:-8} --log-interval 1 --quiet --log-json /tmp/d$merge.jsonl --node-times-out /tmp/d$merge.nodes.json > /tmp/d.log 2>&1
      echo "tandem shape (d) --moe-wgrad-merge $merge rc=$? ($(( $(date +%s) - t0 )) s) $(summary /tmp/d$merge.jsonl)" | tee -a "$OUT/d.txt"; tail -3 /tmp/d.log
      cp /tmp/d$merge.nodes.json "$OUT/d${merge}_nodes.json" 2>/dev/null
      python3 - /tmp/d$merge.jsonl /tmp/d$merge.nodes.json <<'PY' 2>&1 | tee -a "$OUT/d.txt"
import json, statistics, sys
sys.path.insert(0, "devrun")
from hf_peer import flops_per_token, matmul_tflops, parse_args, H200_DENSE_BF16_TFLOPS
fpt = flops_per_token(parse_args([])); peak = matmul_tflops()
tps = statistics.median(json.loads(l)["tokens_per_s"] for l in list(open(sys.argv[1]))[3:])
print("tandem shape (d): %.0f tokens/s, %.3f GFLOP/token, %.0f TFLOP/s; MFU %.1f%% of the measured bf16 rate (%.0f TFLOP/s), %.1f%% of the datasheet's %.0f" % (tps, fpt / 1e9, fpt * tps / 1e12, 100 * fpt * tps / 1e12 / peak, peak, 100 * fpt * tps / 1e12 / H200_DENSE_BF16_TFLOPS, H200_DENSE_BF16_TFLOPS))
for k, v in json.load(open(sys.argv[2]))["nodes"].items(): print("  node", k, " ".join("%s %.3f ms" % (p, t * 1e3) for p, t in v.items() if isinstance(t, (int, float))))
PY
      echo "plan from this run's node times: --global-batch-size 8 --moe-wgrad-merge $merge" | tee -a "$OUT/d.txt"
      $B/tandem plan --device cuda $SHAPE_D --moe-wgrad-merge $merge --global-batch-size 8 --node-times /tmp/d$merge.nodes.json 2>&1 | tail -4 | tee -a "$OUT/d.txt"
      done
      lay="--global-batch-size 16 --data-parallel-size 2 --expert-model-parallel-size 2 --schedule combined-1f1b"
      for merge in ${D_MERGES:-1 8}; do
      echo "plan from the --moe-wgrad-merge $merge run's node times: $lay --moe-wgrad-merge $merge" | tee -a "$OUT/d.txt"
      $B/tandem plan --device cuda $SHAPE_D $lay --moe-wgrad-merge $merge --node-times /tmp/d$merge.nodes.json 2>&1 | tail -4 | tee -a "$OUT/d.txt"
      done
      [ "${PEERS:-1}" = 0 ] && continue
      timeout 500 python3 devrun/hf_peer.py --compile --steps ${PEER_STEPS:-5} --warmup-steps 3 2> /tmp/peer_d.err | grep -E "RESULT|warm-up" | tee -a "$OUT/d.txt"; tail -3 /tmp/peer_d.err ;;
    recipes)
      # Megatron-LM's recipes of examples/megatron/ (docs/megatron.md), shrunk, as written on one
      # GPU and on the CPU from the same seed: the first step's losses side by side (bf16 on
      # the GPU against fp32 on the CPU), then each run's log lines.
      for r in llama3_8b mixtral_8x7b qwen3_30b_a3b deepseek_v3; do
        for dev in cuda cpu; do
          d=$(mktemp -d)
          OUT_DIR=$d TANDEM=$B/tandem NPROC=1 DEVICE=$dev TRAIN_ITERS=4 timeout 150 bash examples/megatron/$r.sh > /tmp/rec_${r}_$dev.log 2>&1
          echo "recipe $r on $dev rc=$? first step: $(grep -m1 '^iter 1/' /tmp/rec_${r}_$dev.log)" | tee -a "$OUT/recipes.txt"
        done
        grep -E "^iter|error" /tmp/rec_${r}_cuda.log | tee -a "$OUT/recipes.txt"
      done ;;
    mtp)
      # What DeepSeek-V3's multi-token prediction and capacity dropping cost on shape (d) (4
      # layers, one GPU, random tokens): the plain run, --mtp-num-layers 1, and dropping past a
      # capacity factor of 1, side by side (docs/megatron.md).
      SD="$SHAPE_D --mock-data --global-batch-size 4"
      T=/tmp/mtp; mkdir -p $T
      tandem_runs "$SD" 1 240 $T mtp.txt "d-plain" "d-mtp1 --mtp-num-layers 1" \
        "d-drop1 --moe-expert-capacity-factor 1" ;;
    preflight)
      # The pre-flight memory gate (docs/memory.md): shape (d) at 16 layers plans more than one
      # GPU holds; it must stop with exit 2 within seconds, before the GPU holds any of the model.
      SHAPE_D16=$(echo "$SHAPE_D" | sed 's/--num-layers 4 /--num-layers 16 /; s/\[0,1,1,1\]/[0,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]/')
      t0=$(date +%s.%N)
      timeout 120 $B/tandem train --device cuda $SHAPE_D16 --global-batch-size 8 --mock-data --train-iters 2 > /tmp/pre.log 2>&1 &
      pid=$!; used=0
      while kill -0 $pid 2>/dev/null; do
        u=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1); [ "$u" -gt "$used" ] && used=$u; sleep 0.2
      done
      wait $pid; rc=$?
      echo "preflight: shape (d) at 16 layers rc=$rc in $(python3 -c "import time;print(round(time.time()-$t0,2))") s, the GPU's most memory used while it ran: $used MiB" | tee "$OUT/preflight.txt"
      cat /tmp/pre.log | tee -a "$OUT/preflight.txt"
      # What the gate costs: a run that fits, the time to its first step with the gate and the
      # start-up as a whole.
      for i in 1 2 3; do
        /usr/bin/time -f "preflight: a fitting run (shape d, 4 layers, 1 step) took %e s" $B/tandem train --device cuda $SHAPE_D --global-batch-size 1 --mock-data --train-iters 1 --quiet 2>&1 | tail -1 | tee -a "$OUT/preflight.txt"
      done ;;
    fault)
      # Note [Bounded waits on the GPU]: rank 1 hangs on the host before step 3 (TANDEM_FAULT);
      # rank 0's GPU then waits in NCCL for it, and rank 0 must stop with an error naming the
      # wait within --comm-timeout instead of hanging (rc 124 here would be the hang).
      A="--device cuda --addition-max-digits 2 --micro-batch-size 4 --global-batch-size 16 --train-iters 6 --log-interval 1 --comm-timeout 15"
      M="mpirun --allow-run-as-root --oversubscribe -np 2 -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x TANDEM_FAULT"
      for layout in "--expert-model-parallel-size 2 --schedule combined-1f1b" "--pipeline-model-parallel-size 2 --schedule 1f1b" ""; do
        t0=$(date +%s)
        TANDEM_FAULT=rank=1,iter=3,mode=hang timeout 150 $M $B/tandem train $A $layout > /tmp/fault.log 2>&1
        echo "fault hang [${layout:-dp2}]: rc=$? after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/fault.txt"
        grep -m2 -E "waited|error" /tmp/fault.log | cut -c1-400 | tee -a "$OUT/fault.txt"
      done ;;
    gpupipe)
      timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH \
        $B/test_gpu_pipeline > "$OUT/test_gpu_pipeline.log" 2>&1; echo "gpu pipeline rc=$?"; grep -E "FAILED|PASSED|OK \]" "$OUT/test_gpu_pipeline.log" | tail -8 ;;
    train)
      timeout 300 $B/tandem train --device cuda --addition-max-digits 2 --micro-batch-size 8 \
        --global-batch-size 8 --train-iters 100 --log-interval 20 --log-json "$OUT/train.jsonl" \
        > "$OUT/train.log" 2>&1; echo "train rc=$?"; tail -8 "$OUT/train.log" ;;
    nccl)
      timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH \
        $B/test_nccl > "$OUT/test_nccl.log" 2>&1; echo "nccl rc=$?"; grep -E "FAILED|PASSED|NCCL " "$OUT/test_nccl.log" | tail -20 ;;
    multi)
      # 2 GPUs against 1: the same 30 steps of the demo model (fp32 masters, bf16 activations)
      # under PP2 (1f1b, interleaved), EP2 and DP2; losses compared by bench/compare_losses.py.
      A="--device cuda --addition-max-digits 2 --micro-batch-size 4 --global-batch-size 16 --train-iters 30 --log-interval 10 --seed 7"
      M="mpirun --allow-run-as-root --oversubscribe -np 2 -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH"
      timeout 120 $B/tandem train $A --log-json "$OUT/one.jsonl" > "$OUT/one.log" 2>&1; echo "one rc=$?"
      timeout 180 $M $B/tandem train $A --pipeline-model-parallel-size 2 --schedule 1f1b --log-json "$OUT/pp2.jsonl" > "$OUT/pp2.log" 2>&1; echo "pp2 rc=$?"
      timeout 180 $M $B/tandem train $A --pipeline-model-parallel-size 2 --schedule interleaved-1f1b --virtual-pipeline-model-parallel-size 2 --log-json "$OUT/vpp2.jsonl" > "$OUT/vpp2.log" 2>&1; echo "vpp2 rc=$?"
      timeout 180 $M $B/tandem train $A --expert-model-parallel-size 2 --log-json "$OUT/ep2.jsonl" > "$OUT/ep2.log" 2>&1; echo "ep2 rc=$?"
      timeout 180 $M $B/tandem train $A --log-json "$OUT/dp2.jsonl" > "$OUT/dp2.log" 2>&1; echo "dp2 rc=$?"
      for f in pp2 vpp2 ep2 dp2; do tail -3 "$OUT/$f.log"; done
      python3 devrun/compare_losses.py "$OUT/one.jsonl" "$OUT"/pp2.jsonl "$OUT"/vpp2.jsonl "$OUT"/ep2.jsonl "$OUT"/dp2.jsonl ;;
    equiv)
      # 2 GPUs against 1 at a small learning rate (trajectories stay comparable): 20 steps.
      A="--device cuda --addition-max-digits 2 --micro-batch-size 4 --global-batch-size 16 --train-iters 20 --lr 3e-4 --min-lr 3e-5 --lr-warmup-iters 2 --log-interval 10 --seed 7 --quiet"
      M="mpirun --allow-run-as-root --oversubscribe -np 2 -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH"
      T=/tmp/equiv; mkdir -p $T
      timeout 120 $B/tandem train $A --log-json $T/one.jsonl > $T/one.log 2>&1; echo "one rc=$?"
      timeout 180 $M $B/tandem train $A --pipeline-model-parallel-size 2 --log-json $T/pp2.jsonl > $T/pp2.log 2>&1; echo "pp2 rc=$?"
      timeout 180 $M $B/tandem train $A --expert-model-parallel-size 2 --log-json $T/ep2.jsonl > $T/ep2.log 2>&1; echo "ep2 rc=$?"
      timeout 180 $M $B/tandem train $A --log-json $T/dp2.jsonl > $T/dp2.log 2>&1; echo "dp2 rc=$?"
      python3 devrun/compare_losses.py --rtol=1e-2 $T/one.jsonl $T/pp2.jsonl $T/ep2.jsonl $T/dp2.jsonl | tee "$OUT/equiv.txt"
      cat $T/*.jsonl > "$OUT/equiv.jsonl" ;;
    multi-b)
      # Shape (b) on 2 GPUs: tandem PP2 (1f1b, interleaved) and EP2 x DP2 beside torch's pp and ep.
      SB="--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --num-query-groups 8 --num-experts 8 --moe-router-topk 2 --ffn-hidden-size 2816 --vocab-size 32000 --seq-length 2048 --micro-batch-size 2"
      M="mpirun --allow-run-as-root --oversubscribe -np 2 -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH"
      T=/tmp/multib; mkdir -p $T
      for run in "pp2-1f1b --pipeline-model-parallel-size 2 --schedule 1f1b --global-batch-size 16" \
                 "pp2-interleaved --pipeline-model-parallel-size 2 --schedule interleaved-1f1b --virtual-pipeline-model-parallel-size 2 --global-batch-size 16" \
                 "ep2 --expert-model-parallel-size 2 --global-batch-size 32"; do
        set -- $run; name=$1; shift
        timeout 240 $M $B/tandem train --device cuda $SB "$@" --train-iters 7 --log-interval 1 --quiet --log-json $T/$name.jsonl > $T/$name.log 2>&1
        echo "tandem $name rc=$? $(python3 -c "import json,statistics as s;r=[json.loads(l) for l in open('$T/$name.jsonl')][3:];print('tokens/s', round(s.median(x['tokens_per_s'] for x in r)), 'peak GiB', [round(b/2**30,2) for b in r[-1]['mem_peak_bytes']])" 2>&1)" | tee -a "$OUT/multi_b.txt"
      done
      for m in "pp --schedule 1F1B --compile --num-microbatches 8" "ep --num-microbatches 8"; do
        timeout 300 torchrun --nproc-per-node 2 devrun/torch_peer.py --mode $m $SB --steps 6 --warmup-steps 3 2> $T/peer.err | grep RESULT | tee -a "$OUT/multi_b.txt"
      done ;;
    overlap-eq)
      # Combined 1F1B with EP2 on 2 GPUs, the all-to-all on its own stream (--comm-overlap on)
      # and on the compute stream (off): the same losses bit for bit; both against one GPU.
      A="--device cuda --addition-max-digits 2 --micro-batch-size 4 --global-batch-size 16 --train-iters 20 --lr 3e-4 --min-lr 3e-5 --lr-warmup-iters 2 --log-interval 10 --seed 7 --quiet"
      M="mpirun --allow-run-as-root --oversubscribe -np 2 -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH"
      T=/tmp/ovl; mkdir -p $T
      timeout 120 $B/tandem train $A --log-json $T/one.jsonl > $T/one.log 2>&1; echo "one rc=$?"
      for ov in on off; do
        timeout 180 $M $B/tandem train $A --expert-model-parallel-size 2 --schedule combined-1f1b --comm-overlap $ov --log-json $T/ep2c-$ov.jsonl > $T/ep2c-$ov.log 2>&1; echo "ep2 combined overlap=$ov rc=$?"; tail -2 $T/ep2c-$ov.log
      done
      # Note [Paired forwards]: (0F0;0F1) first, the all-to-all on its own stream.
      timeout 180 $M $B/tandem train $A --expert-model-parallel-size 2 --schedule combined-1f1b --pair-first-forwards --log-json $T/ep2c-paired.jsonl > $T/ep2c-paired.log 2>&1; echo "ep2 combined paired rc=$?"
      timeout 180 $M $B/tandem train $A --pipeline-model-parallel-size 2 --schedule combined-1f1b --log-json $T/pp2c.jsonl > $T/pp2c.log 2>&1; echo "pp2 combined rc=$?"
      timeout 180 $M $B/tandem train $A --pipeline-model-parallel-size 2 --schedule dualpipev --virtual-pipeline-model-parallel-size 2 --log-json $T/pp2d.jsonl > $T/pp2d.log 2>&1; echo "pp2 dualpipev rc=$?"
      python3 devrun/compare_losses.py --rtol=0 $T/ep2c-off.jsonl $T/ep2c-on.jsonl $T/ep2c-paired.jsonl | tee "$OUT/overlap_eq.txt"
      python3 devrun/compare_losses.py --rtol=1e-2 $T/one.jsonl $T/ep2c-on.jsonl $T/pp2c.jsonl $T/pp2d.jsonl | tee -a "$OUT/overlap_eq.txt" ;;
    multi-b2)
      # Issue 6's benchmark, shape (b) on 2 GPUs: tandem's PP2 schedules and EP2 with and without
      # overlap, then torch_peer.py's pp schedules and ep mode, in one call.
      SB="--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --num-query-groups 8 --num-experts 8 --moe-router-topk 2 --ffn-hidden-size 2816 --vocab-size 32000 --seq-length 2048 --micro-batch-size 2"
      T=/tmp/multib; mkdir -p $T
      # tandem reads random tokens (--mock-data), as torch_peer.py does; DATA="" the addition task.
      tandem_runs "$SB ${DATA---mock-data}" 2 150 $T multi_b.txt "one-gpu --global-batch-size 16" \
                 "dp2 --global-batch-size 32 --trace $OUT/trace-dp2.json --node-times-out $OUT/nodes-dp2.json" \
                 "dp2-end --global-batch-size 32 --overlap-grad-reduce=false" \
                 "pp2-1f1b --pipeline-model-parallel-size 2 --schedule 1f1b --global-batch-size 16 --node-times-out $OUT/nodes-pp2.json --trace $OUT/trace-pp2-1f1b.json" \
                 "pp2-interleaved --pipeline-model-parallel-size 2 --schedule interleaved-1f1b --virtual-pipeline-model-parallel-size 2 --global-batch-size 16" \
                 "pp2-combined --pipeline-model-parallel-size 2 --schedule combined-1f1b --global-batch-size 16 --node-times-out $OUT/nodes-pp2-combined.json" \
                 "pp2-dualpipev --pipeline-model-parallel-size 2 --schedule dualpipev --virtual-pipeline-model-parallel-size 2 --global-batch-size 16" \
                 "pp2-1f1b-recompute --pipeline-model-parallel-size 2 --schedule 1f1b --global-batch-size 16 --recompute-experts" \
                 "pp2-interleaved-recompute --pipeline-model-parallel-size 2 --schedule interleaved-1f1b --virtual-pipeline-model-parallel-size 2 --global-batch-size 16 --recompute-experts" \
                 "ep2-1f1b --expert-model-parallel-size 2 --schedule 1f1b --global-batch-size 32 --node-times-out $OUT/nodes-ep2.json --routing-out $OUT/routing-ep2.json" \
                 "ep2-combined-off --expert-model-parallel-size 2 --schedule combined-1f1b --comm-overlap off --global-batch-size 32" \
                 "ep2-combined-on --expert-model-parallel-size 2 --schedule combined-1f1b --comm-overlap on --global-batch-size 32 --trace $OUT/trace-ep2-combined.json --node-times-out $OUT/nodes-ep2-combined.json --routing-out $OUT/routing-ep2-combined.json" \
                 "ep2-combined-end --expert-model-parallel-size 2 --schedule combined-1f1b --comm-overlap on --global-batch-size 32 --defer-optimizer=false --trace $OUT/trace-ep2-combined-end.json" \
                 "ep2-combined-reduce-end --expert-model-parallel-size 2 --schedule combined-1f1b --comm-overlap on --global-batch-size 32 --overlap-grad-reduce=false --trace $OUT/trace-ep2-combined-reduce-end.json" \
                 "ep2-1f1b-balanced --expert-model-parallel-size 2 --schedule 1f1b --global-batch-size 32 $BALANCED --node-times-out $OUT/nodes-ep2-balanced.json" \
                 "ep2-combined-on-balanced --expert-model-parallel-size 2 --schedule combined-1f1b --comm-overlap on --global-batch-size 32 $BALANCED --node-times-out $OUT/nodes-ep2-combined-balanced.json" \
                 "ep2-combined-paired --expert-model-parallel-size 2 --schedule combined-1f1b --pair-first-forwards --global-batch-size 32 --trace $OUT/trace-ep2-combined-paired.json --node-times-out $OUT/nodes-ep2-combined-paired.json --routing-out $OUT/routing-ep2-combined-paired.json" \
                 "ep2-combined-paired-balanced --expert-model-parallel-size 2 --schedule combined-1f1b --pair-first-forwards --global-batch-size 32 $BALANCED" \
                 "ep2-combined-split --expert-model-parallel-size 2 --schedule combined-1f1b --comm-overlap split --global-batch-size 32 --trace $OUT/trace-ep2-combined-split.json" \
                 "ep2-combined-split-balanced --expert-model-parallel-size 2 --schedule combined-1f1b --comm-overlap split --global-batch-size 32 $BALANCED" \
                 "ep2-combined-rebalanced --expert-model-parallel-size 2 --schedule combined-1f1b --comm-overlap on --global-batch-size 32 --rebalance-experts 2 --trace $OUT/trace-ep2-combined-rebalanced.json --node-times-out $OUT/nodes-ep2-combined-rebalanced.json --routing-out $OUT/routing-ep2-combined-rebalanced.json"
      # Note [A stream pair per half]: the same steps, bit for bit.
      [ -s $T/ep2-combined-on.jsonl ] && [ -s $T/ep2-combined-split.jsonl ] &&
        python3 devrun/compare_losses.py --rtol=0 $T/ep2-combined-on.jsonl $T/ep2-combined-split.jsonl | tee -a "$OUT/multi_b.txt"
      # Note [Gradients reduced beside the backward]: the same steps, bit for bit (two ranks);
      # how much of the all-reduce ran beside the backward.
      [ -s $OUT/trace-dp2.json ] && python3 devrun/exposed_gaps.py $OUT/trace-dp2.json | tee -a "$OUT/multi_b.txt"
      [ -s $T/dp2.jsonl ] && [ -s $T/dp2-end.jsonl ] &&
        python3 devrun/compare_losses.py --rtol=0 $T/dp2.jsonl $T/dp2-end.jsonl | tee -a "$OUT/multi_b.txt"
      [ -s $T/ep2-combined-on.jsonl ] && [ -s $T/ep2-combined-reduce-end.jsonl ] &&
        python3 devrun/compare_losses.py --rtol=0 $T/ep2-combined-on.jsonl $T/ep2-combined-reduce-end.jsonl | tee -a "$OUT/multi_b.txt"
      # Note [The update beside the first forward]: the same steps, bit for bit.
      [ -s $T/ep2-combined-on.jsonl ] && [ -s $T/ep2-combined-end.jsonl ] &&
        python3 devrun/compare_losses.py --rtol=0 $T/ep2-combined-on.jsonl $T/ep2-combined-end.jsonl | tee -a "$OUT/multi_b.txt"
      # Note [Rebalancing experts]: the same training whatever rank runs which expert (the norm
      # is summed expert by expert there, Note [Norm by expert], so its last bits may differ).
      [ -s $T/ep2-combined-on.jsonl ] && [ -s $T/ep2-combined-rebalanced.jsonl ] &&
        python3 devrun/compare_losses.py --rtol=1e-5 $T/ep2-combined-on.jsonl $T/ep2-combined-rebalanced.jsonl | tee -a "$OUT/multi_b.txt"
      # The same steps, bit for bit, whatever the order (Note [Paired forwards]) and run to run
      # (Note [Deterministic attention backward]).
      for r in "" -balanced; do
        [ -s $T/ep2-combined-on$r.jsonl ] && [ -s $T/ep2-combined-paired$r.jsonl ] &&
          python3 devrun/compare_losses.py --rtol=0 $T/ep2-combined-on$r.jsonl $T/ep2-combined-paired$r.jsonl | tee -a "$OUT/multi_b.txt"
      done
      # The planner against these runs, on this machine (Note [Gradient reduction in the plan],
      # Note [Planned and measured on one chart]): each run's own node times and last-step trace.
      plan_vs() {  # RUN NODES TRACE "layout options": the plan against that run's medians
        local run=$1 nodes=$OUT/$2 trace=$OUT/$3; shift 3
        [ -s $nodes ] && [ -s $trace ] && [ -s $T/$run.jsonl ] || return 0
        echo "planner vs $run:" | tee -a "$OUT/multi_b.txt"
        $B/tandem plan --device cuda $SB $1 --node-times $nodes --measured-trace $trace --json > $T/plan-$run.json 2>&1
        python3 -c "
import json,sys,statistics as s
p=json.load(open(sys.argv[1])); r=[json.loads(l) for l in open(sys.argv[2])][3:]
step=s.median(x['step_seconds'] for x in r); tok=s.median(x['tokens_per_s'] for x in r)
pt=p.get('tokens_per_s',0)
print('  planned: forward-backward ms', round(1e3*p['step_time_s'],2), 'whole step ms', round(1e3*p['full_step_s'],2), 'tokens/s', round(pt), '| measured: step ms', round(1e3*step,2), 'tokens/s', round(tok), '(plan %+.1f%%)' % (100*(pt-tok)/tok))
for k in p['ranks']: print('  rank', k['rank'], 'measured forward-backward (trace) ms', round(1e3*k.get('measured_forward_backward_s',0),2), 'planned peak GiB', round(k['peak_bytes']/2**30,2), 'all-reduce after the backward ms', round(1e3*k['grad_reduce_tail_s'],2))
m=r[-1]['mem_peak_bytes']; print('  measured peak GiB', [round(b/2**30,2) for b in (m if isinstance(m,list) else [m])])" $T/plan-$run.json $T/$run.jsonl 2>&1 | tee -a "$OUT/multi_b.txt"
      }
      plan_vs dp2 nodes-dp2.json trace-dp2.json "--global-batch-size 32 --data-parallel-size 2"
      plan_vs pp2-1f1b nodes-pp2.json trace-pp2-1f1b.json "--pipeline-model-parallel-size 2 --schedule 1f1b --global-batch-size 16"
      plan_vs ep2-combined-on nodes-ep2-combined.json trace-ep2-combined.json "--expert-model-parallel-size 2 --schedule combined-1f1b --global-batch-size 32 --routing $OUT/routing-ep2-combined.json --routing-rank 0"
      peer_runs "$SB" 2 170 $T multi_b.txt ;;
    capacity)
      # Megatron-LM's expert capacity against the dropless run (docs/model.md "Expert capacity"):
      # shape (b) with random tokens, on one GPU and EP2 combined 1F1B, dropless, dropping past a
      # capacity factor of 1 (by weight; by position), and padded to factors 1 and 1.25; then
      # the same under forced balancing's random logits. Each summary line: tokens/s, the
      # peaks, the all-to-all's time and exposure, and the step's expert rows max / mean.
      SB="${SHAPE_B/--num-microbatches 8/} ${DATA---mock-data}"; T=/tmp/capacity; mkdir -p $T
      for r in fresh balanced; do
        extra=""; [ $r = balanced ] && extra="--moe-router-force-load-balancing"
        wheres=("1|gpu1|--global-batch-size 16")
        [ "$G" -ge 2 ] && wheres+=("2|ep2|--expert-model-parallel-size 2 --schedule combined-1f1b --comm-overlap on --global-batch-size 32")
        for where in "${wheres[@]}"; do
          IFS='|' read -r n w L <<< "$where"
          tandem_runs "$SB" $n 200 $T capacity.txt "$w-$r-dropless $L $extra" \
            "$w-$r-drop1 $L $extra --moe-expert-capacity-factor 1" \
            "$w-$r-drop1-position $L $extra --moe-expert-capacity-factor 1 --moe-token-drop-policy position" \
            "$w-$r-pad1 $L $extra --moe-expert-capacity-factor 1 --moe-pad-expert-input-to-capacity" \
            "$w-$r-pad1.25 $L $extra --moe-expert-capacity-factor 1.25 --moe-pad-expert-input-to-capacity"
        done
      done ;;
    ab)
      # A/B of tandem binaries (AB="tandem-base tandem", each in devrun/bin) on shape (b)'s EP2
      # combined 1F1B with overlap, fresh and balanced routing, binary by binary for each; the
      # last step's trace of each run.
      SB="${SHAPE_B/--num-microbatches 8/} ${DATA---mock-data}"; T=/tmp/ab; mkdir -p $T
      for r in fresh balanced; do
        for bin in ${AB:-tandem}; do
          extra=""; [ $r = balanced ] && extra="$BALANCED"
          TANDEM=$B/$bin tandem_runs "$SB" 2 150 $T ab.txt "$bin-$r --expert-model-parallel-size 2 --schedule combined-1f1b --comm-overlap on --global-batch-size 32 $extra ${AB_EXTRA:-} --trace $OUT/trace-$bin-$r.json"
        done
      done ;;
    ab1)
      # A/B of tandem binaries on one GPU (AB="tandem-base tandem", each in devrun/bin) at shapes
      # (a) to (d), one process each, the binaries alternating twice per shape: what a change
      # does to throughput and peak memory, side by side in one call.
      # (a) and (b) as their global batch (train takes Megatron-LM's --global-batch-size; the
      # shapes' --num-microbatches is torch_peer.py's); AB_SHAPES picks shapes.
      T=/tmp/ab1; mkdir -p $T
      for sh in ${AB_SHAPES:-a b c d}; do
        case $sh in
          a) S="${SHAPE_A/--num-microbatches 4/--global-batch-size 32}" ;;
          b) S="${SHAPE_B/--num-microbatches 8/--global-batch-size 16}" ;;
          c) S="$SHAPE_C --global-batch-size 8" ;; d) S="$SHAPE_D --global-batch-size 8" ;;
        esac
        for rep in 1 2; do
          for bin in ${AB:-tandem}; do
            f=$T/$sh-$bin-$rep
            timeout 200 $B/$bin train --device cuda $S --mock-data --train-iters ${STEPS:-7} --log-interval 1 --quiet --log-json $f.jsonl > $f.log 2>&1
            echo "shape ($sh) $bin #$rep rc=$? $(summary $f.jsonl)" | tee -a "$OUT/ab1.txt"
            [ -s $f.jsonl ] || tail -3 $f.log
          done
        done
      done ;;
    defer)
      # Note [The update beside the first forward]: EP2 combined 1F1B with overlap on shape (b),
      # the update at the step's end against --defer-optimizer, in alternating order (fresh
      # routing, then balanced); the losses bit for bit.
      SB="${SHAPE_B/--num-microbatches 8/} ${DATA---mock-data}"; T=/tmp/defer; mkdir -p $T
      C="--expert-model-parallel-size 2 --schedule combined-1f1b --comm-overlap on --global-batch-size 32"
      for r in fresh balanced; do
        extra=""; [ $r = balanced ] && extra="$BALANCED"
        tandem_runs "$SB" 2 150 $T defer.txt "end-$r-1 $C $extra --defer-optimizer=false --trace $T/trace-end-$r.json" "deferred-$r-1 $C $extra --defer-optimizer --trace $OUT/trace-deferred-$r.json" \
          "deferred-$r-2 $C $extra --defer-optimizer" "end-$r-2 $C $extra --defer-optimizer=false"
        python3 devrun/compare_losses.py --rtol=0 $T/end-$r-1.jsonl $T/deferred-$r-1.jsonl $T/deferred-$r-2.jsonl | tee -a "$OUT/defer.txt"
        # Where the last step's exposed all-to-all lies, without and with the deferred update.
        for f in $T/trace-end-$r.json $OUT/trace-deferred-$r.json; do
          echo "$f:"; python3 devrun/exposed_gaps.py --top 4 $f
        done 2>&1 | tee -a "$OUT/defer.txt"
      done ;;
    lanes)
      # Note [Lanes]: the experts' products on 1, 2, 4 and 8 lanes (--expert-lanes), one GPU
      # and EP2 combined 1F1B on shape (b), random tokens.
      SB="${SHAPE_B/--num-microbatches 8/} ${DATA---mock-data}"; T=/tmp/lanes; mkdir -p $T
      for n in ${LANES:-1 2 4 8}; do
        echo "--expert-lanes $n" | tee -a "$OUT/lanes.txt"
        tandem_runs "$SB --expert-lanes $n" 2 150 $T lanes.txt "one-gpu --global-batch-size 16" \
          "ep2-combined --expert-model-parallel-size 2 --schedule combined-1f1b --global-batch-size 32"
      done ;;
    repeat)
      # Shape (b) on random tokens, EP2 combined 1F1B twice and paired once, one GPU twice: are
      # the losses the same bit for bit (deterministic kernels, Note [Paired forwards])?
      SB="${SHAPE_B/--num-microbatches 8/} ${DATA---mock-data}"; T=/tmp/repeat; mkdir -p $T
      tandem_runs "$SB" 2 150 $T repeat.txt "ep2-a --expert-model-parallel-size 2 --schedule combined-1f1b --global-batch-size 32" \
        "ep2-b --expert-model-parallel-size 2 --schedule combined-1f1b --global-batch-size 32" \
        "ep2-paired --expert-model-parallel-size 2 --schedule combined-1f1b --pair-first-forwards --global-batch-size 32"
      ONLY='^one-gpu$' tandem_runs "$SB" 1 150 $T repeat.txt "one-gpu --global-batch-size 16"
      cp $T/one-gpu.jsonl $T/one-a.jsonl; ONLY='^one-gpu$' tandem_runs "$SB" 1 150 $T repeat.txt "one-gpu --global-batch-size 16"
      python3 devrun/compare_losses.py --rtol=0 $T/ep2-a.jsonl $T/ep2-b.jsonl $T/ep2-paired.jsonl | tee -a "$OUT/repeat.txt"
      python3 devrun/compare_losses.py --rtol=0 $T/one-a.jsonl $T/one-gpu.jsonl | tee -a "$OUT/repeat.txt" ;;
    scale-equiv)
      # Issue 8: the equivalence matrix on all $G GPUs against one (demo model, small learning
      # rate): PP up to 4, EP up to 4, and PP2 x EP4 on 8; every layout that divides $G.
      A="--device cuda --addition-max-digits 2 --micro-batch-size 4 --global-batch-size 32 --train-iters 20 --lr 3e-4 --min-lr 3e-5 --lr-warmup-iters 2 --log-interval 10 --seed 7 --quiet"
      M="mpirun --allow-run-as-root --oversubscribe -np $G -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH"
      T=/tmp/scale-equiv; mkdir -p $T; runs=""
      timeout 120 $B/tandem train $A --log-json $T/one.jsonl > $T/one.log 2>&1; echo "one rc=$?"
      for lay in "pp2 2 1" "pp4 4 1" "ep2 1 2" "ep4 1 4" "pp2ep2 2 2" "pp2ep4 2 4"; do
        set -- $lay; [ $(( G % ($2 * $3) )) -eq 0 ] || continue
        timeout 240 $M $B/tandem train $A --pipeline-model-parallel-size $2 --expert-model-parallel-size $3 --log-json $T/$1.jsonl > $T/$1.log 2>&1
        echo "$1 on $G GPUs rc=$?"; runs="$runs $T/$1.jsonl"
      done
      python3 devrun/compare_losses.py --rtol=1e-2 $T/one.jsonl $runs | tee "$OUT/scale_equiv.txt" ;;
    scale-b)
      # Issue 8: shape (b) scaled to $G GPUs (layers and experts 2 x G, at least 8) beside torch:
      # one GPU of the same shape, then PP=min(G,4) schedules and EP=G with and without overlap.
      LE=$(( 2 * G > 8 ? 2 * G : 8 )); PP=$(( G < 4 ? G : 4 ))
      SG="--num-layers $LE --hidden-size 1024 --num-attention-heads 16 --num-query-groups 8 --num-experts $LE --moe-router-topk 2 --ffn-hidden-size 2816 --vocab-size 32000 --seq-length 2048 --micro-batch-size 2"
      T=/tmp/scaleb; mkdir -p $T; GB=$(( 16 * G / PP ))
      echo "shape (b) scaled to $G GPUs: $LE layers and experts" | tee -a "$OUT/scale_b.txt"
      tandem_runs "$SG ${DATA---mock-data}" $G 240 $T scale_b.txt "one-gpu --global-batch-size 16" \
                 "pp-1f1b --pipeline-model-parallel-size $PP --schedule 1f1b --global-batch-size $GB --node-times-out $OUT/nodes-pp.json" \
                 "pp-interleaved --pipeline-model-parallel-size $PP --schedule interleaved-1f1b --virtual-pipeline-model-parallel-size 2 --global-batch-size $GB" \
                 "pp-combined --pipeline-model-parallel-size $PP --schedule combined-1f1b --global-batch-size $GB" \
                 "pp-dualpipev --pipeline-model-parallel-size $PP --schedule dualpipev --virtual-pipeline-model-parallel-size 2 --global-batch-size $GB" \
                 "ep-1f1b --expert-model-parallel-size $G --schedule 1f1b --global-batch-size $(( 16 * G )) --node-times-out $OUT/nodes-ep.json --routing-out $OUT/routing-ep.json" \
                 "ep-combined-off --expert-model-parallel-size $G --schedule combined-1f1b --comm-overlap off --global-batch-size $(( 16 * G ))" \
                 "ep-combined-on --expert-model-parallel-size $G --schedule combined-1f1b --comm-overlap on --global-batch-size $(( 16 * G ))"
      peer_runs "$SG" $G 300 $T scale_b.txt ;;
    hf)
      # Every family both ways on the CPU path: tandem trains 3 steps from transformers' fixture
      # (tests/fixtures/hf), saves (weights sharded above 40KB, as transformers shards), and
      # transformers loads that checkpoint with tandem's loss (tests/python/check_hf_load.py).
      # ONLY=regex picks fixtures by name.
      T=/tmp/hf; mkdir -p $T
      for fx in tests/fixtures/hf/*/; do
        name=$(basename $fx)
        [[ $name =~ ${ONLY:-.} ]] || continue
        timeout 120 $B/tandem train --load $fx --train-iters 3 --micro-batch-size 1 --global-batch-size 2 \
          --mock-data --lr 1e-3 --lr-warmup-iters 1 --max-shard-size 40KB --save $T/$name --quiet > $T/$name.train.log 2>&1 || tail -3 $T/$name.train.log
        L=$($B/tandem generate --load $T/$name --eval-tokens $fx/tokens.txt | grep -o "loss: [0-9.e+-]*" | cut -d" " -f2)
        timeout 300 python3 devrun/check_hf_load.py $T/$name $fx/tokens.txt $L --rtol 1e-5 > $T/$name.check 2>&1
        echo "$name: rc=$? $(ls $T/$name/iter_0000003 | grep -c -- '-of-') shards; $(tail -1 $T/$name.check)" | tee -a "$OUT/hf.txt"
      done ;;
    prof-a|prof-b)
      # Per-kernel GPU time of two steps (one warm-up, one timed) under Nsight Compute.
      [ $s = prof-a ] && SH="$SHAPE_A" || SH="$SHAPE_B"
      timeout 500 ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file /tmp/$s.csv \
        $B/gpu_train_bench $SH --steps 1 --warmup-steps 1 > "$OUT/$s.bench" 2>&1; echo "ncu rc=$?"
      python3 devrun/kernel_summary.py /tmp/$s.csv > "$OUT/$s.txt" 2>&1; head -60 "$OUT/$s.txt" ;;
    hf-par)
      # As hf, on 2 CPU ranks saving with --ckpt-fully-parallel-save: each rank writes its own
      # shards, rank 0 the index; transformers loads that checkpoint with tandem's loss. PP2 where
      # the layers divide in two, else EP2 x DP2 (the three-layer MoE fixtures).
      T=/tmp/hf-par; mkdir -p $T
      for fx in tests/fixtures/hf/*/; do
        name=$(basename $fx)
        [[ $name =~ ${ONLY:-.} ]] || continue
        layout="--pipeline-model-parallel-size 2"
        [ $(python3 -c "import json;print(json.load(open('$fx/config.json'))['num_hidden_layers'] % 2)") = 1 ] && layout="--expert-model-parallel-size 2"
        timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 $B/tandem train --load $fx --train-iters 3 \
          --micro-batch-size 1 --global-batch-size 2 $layout --mock-data --lr 1e-3 \
          --lr-warmup-iters 1 --max-shard-size 40KB --ckpt-fully-parallel-save --save $T/$name --quiet > $T/$name.train.log 2>&1 || tail -3 $T/$name.train.log
        L=$($B/tandem generate --load $T/$name --eval-tokens $fx/tokens.txt | grep -o "loss: [0-9.e+-]*" | cut -d" " -f2)
        timeout 300 python3 devrun/check_hf_load.py $T/$name $fx/tokens.txt $L --rtol 1e-5 > $T/$name.check 2>&1
        echo "$name: rc=$? $(ls $T/$name/iter_0000003 | grep -c -- 'model-.*-of-') weight shards; $(tail -1 $T/$name.check)" | tee -a "$OUT/hf-par.txt"
      done ;;
    attn-pick)
      # Every attention variant timed (attention_timing), then shapes (a) and (b) trained with
      # the fastest forward and backward variant of their shape (--attention-forward-variant,
      # --attention-backward-variant).
      timeout 200 $B/attention_timing 20 > "$OUT/attn.log" 2>&1; echo "attention_timing rc=$?"; cat "$OUT/attn.log"
      for sh in a b; do
        pick=$(python3 - "$OUT/attn.log" $sh <<'PY'
import re, sys
best = {}
shape = None
for line in open(sys.argv[1]):
    m = re.match(r"shape (\S+):", line)
    if m: shape = m.group(1)
    m = re.match(r"\s+\S+ (fwd|bwd) (\d+) \S+\s+([\d.]+) ms\s+([\d.]+) TFLOP/s \| (.*)", line)
    if m and shape == sys.argv[2]:
        diffs = [float(x) for x in re.findall(r"[\d.]+e[+-]\d+", m.group(5))]
        if all(d < 5e-2 for d in diffs) and float(m.group(4)) > best.get(m.group(1), (0, -1))[1]:
            best[m.group(1)] = (m.group(2), float(m.group(4)))
print("--attention-forward-variant %s --attention-backward-variant %s" % (best.get("fwd", ("0",))[0], best.get("bwd", ("0",))[0]))
PY
)
        echo "shape ($sh) picks $pick"
        [ $sh = a ] && SH="$SHAPE_A" || SH="$SHAPE_B"
        timeout 300 $B/gpu_train_bench $SH $pick --steps 10 --warmup-steps 3 2> "$OUT/bench_$sh.pick.err" | tee -a "$OUT/results.jsonl"
      done ;;
    expert-gemm)
      # The experts' products per expert, on lanes, rows balanced, cuBLAS grouped, as one, each
      # with the host's time to issue it, and the grouped op with new row counts each call
      # (bench/expert_gemm_timing.cc; stage bench/expert_gemm_timing).
      timeout 200 $B/expert_gemm_timing 50 ${EXPERT_GEMM_CASES:-} > "$OUT/expert_gemm.txt" 2>&1; echo "expert_gemm_timing rc=$?"; cat "$OUT/expert_gemm.txt" ;;
    attn)
      [ -x $B/attention_timing ] && timeout 120 $B/attention_timing > "$OUT/attn.log" 2>&1; cat "$OUT/attn.log" ;;
    docmask)
      # Megatron-LM's document masking (docs/data.md "Documents in a sample") on shape (c), one
      # GPU: the same packed documents trained plain and with --reset-attention-mask
      # --document-positions --eod-mask-loss; tokens/s of each and their ratio. The data: an llm.c
      # token file (uint32) of random ids below V - 1, each document closed by the end-of-document
      # id V - 1 after DOC_LEN tokens on average (default 512; lengths uniform in [L/2, 3L/2]).
      # Then the attention kernels alone within documents of several lengths against plain
      # causal (attention_timing documents).
      T=/tmp/docmask; rm -rf $T; mkdir -p $T
      V=$(echo "$SHAPE_C" | sed -E 's/.*--vocab-size ([0-9]+).*/\1/')
      python3 -c "
import array,random,struct,sys
V,L,n=int(sys.argv[1]),int(sys.argv[2]),1<<22
rng=random.Random(1);t=array.array('I',(rng.randrange(V-1) for _ in range(n)))
i=0
while True:
  i+=rng.randint(L//2,3*L//2)
  if i>=n: break
  t[i]=V-1
with open(sys.argv[3],'wb') as f: f.write(struct.pack('<3i',20240520,2,n)+bytes(1012)); t.tofile(f)" $V ${DOC_LEN:-512} $T/docs.bin
      DOCS="--reset-attention-mask --document-positions --eod-mask-loss --eod-token-id $((V - 1))"
      for run in "plain|" "documents|$DOCS"; do
        name=${run%%|*}; opts=${run#*|}
        timeout 300 $B/tandem train --device cuda $SHAPE_C --global-batch-size 8 --data-path $T/docs.bin --data-format tokens $opts --train-iters ${STEPS:-8} --log-interval 1 --quiet --log-json $T/$name.jsonl > $T/$name.log 2>&1
        echo "tandem docmask $name rc=$? $(summary $T/$name.jsonl)" | tee -a "$OUT/docmask.txt"; [ -s $T/$name.jsonl ] || tail -3 $T/$name.log
      done
      python3 -c "
import json,statistics as s,sys
m=lambda f: s.median(json.loads(l)['tokens_per_s'] for l in list(open(f))[3:])
p,d=m(sys.argv[1]),m(sys.argv[2])
print('docmask shape (c), documents of ~%s tokens: plain %.0f tokens/s, documents %.0f tokens/s, documents / plain %.3f' % (sys.argv[3], p, d, d / p))" $T/plain.jsonl $T/documents.jsonl ${DOC_LEN:-512} 2>&1 | tee -a "$OUT/docmask.txt"
      [ -x $B/attention_timing ] && timeout 200 $B/attention_timing 20 documents 2>&1 | tee -a "$OUT/docmask.txt" ;;
    bench-a) timeout 300 $B/gpu_train_bench $SHAPE_A --steps 10 --warmup-steps 3 2> "$OUT/bench_a.err" | tee -a "$OUT/results.jsonl"; tail -3 "$OUT/bench_a.err" ;;
    bench-b) timeout 300 $B/gpu_train_bench $SHAPE_B --steps 10 --warmup-steps 3 2> "$OUT/bench_b.err" | tee -a "$OUT/results.jsonl"; tail -3 "$OUT/bench_b.err" ;;
    peer-a) for m in "" "--compile"; do timeout 400 python3 devrun/torch_peer.py --mode single $m $SHAPE_A --steps 10 --warmup-steps 3 2> "$OUT/peer_a$m.err" | grep RESULT | tee -a "$OUT/results.jsonl"; done ;;
    peer-b) for m in "" "--compile"; do timeout 400 python3 devrun/torch_peer.py --mode single $m $SHAPE_B --steps 10 --warmup-steps 3 2> "$OUT/peer_b$m.err" | grep RESULT | tee -a "$OUT/results.jsonl"; done ;;
  esac
done
