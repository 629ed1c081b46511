#!/bin/bash
# One device batch: install the wheels, then run the steps named on the command line, each
# under its own time limit, logging to $OUT/<step>.log. Usage on the device machine:
#   bash benchmarks/gpu_session.sh diagnose tests model:resnet18:400
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=passive
export AUTOSCHED_CACHE_DIR=/tmp/aus-cache
# picks and cubins made ahead for the same target (a carried .gpu-cache.tgz of a cache folder:
# `compile(..., target="cuda", schedule="model")` on any machine with NVRTC fills one)
if [ -e .gpu-cache.tgz ]; then
    mkdir -p -m 700 "$AUTOSCHED_CACHE_DIR" && tar xzf .gpu-cache.tgz -C "$AUTOSCHED_CACHE_DIR"
fi
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
step() {  # name limit command...
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "== $name rc=$? $((SECONDS - t0)) s"; tail -n 25 "$OUT/$name.log"
}
unpack_logs() {  # the logs carried gzipped in .gpu-logs-gz, into .gpu-logs (kept if there)
    mkdir -p .gpu-logs
    for f in .gpu-logs-gz/*.gz; do
        [ -e "$f" ] && [ ! -e ".gpu-logs/$(basename "${f%.gz}")" ] \
            && zcat "$f" > ".gpu-logs/$(basename "${f%.gz}")"
    done
}
for s in "$@"; do
    case $s in
        diagnose) step diagnose 300 python3 benchmarks/gpu_diagnose.py ;;
        sanitize) command -v compute-sanitizer && step sanitize 200 compute-sanitizer \
                      --tool memcheck python3 benchmarks/gpu_diagnose.py direct ;;
        tests) step tests 330 python3 -m pytest -q -m gpu tests -rfE -p no:cacheprovider ;;
        tune) step tune 560 python3 benchmarks/tune_gpu.py ;;
        e2e) step e2e 400 python3 benchmarks/e2e_gpu.py ;;
        model:*)  # model:<name>:<seconds>: tune <name> on cuda for that long, then time it end to end
            IFS=: read -r _ name secs <<< "$s"
            onnx=$(python3 -c "from autosched.testing import models; print(models.save('$name'))")
            step "tune-$name" "$secs" python3 -m autosched tune "$onnx" --target cuda \
                --trials 4000 --batch-size 16 --log "$OUT/$name-cuda.jsonl"
            step "e2e-$name" 300 python3 benchmarks/e2e_gpu.py --models "$name" \
                --log "$OUT/$name-cuda.jsonl" ;;
        replay:*)  # replay:<name>: time <name> with its bundled H200 log (tuning_logs/)
            name=${s#replay:}
            zcat "tuning_logs/${name}_cuda_h200.jsonl.gz" > "/tmp/${name}-cuda.jsonl"
            step "replay-$name" 300 python3 benchmarks/e2e_gpu.py --models "$name" \
                --log "/tmp/${name}-cuda.jsonl" ;;
        peers)  # both bundled H200 logs against torch eager / compile / reduce-overhead, TF32 on and off
            zcat tuning_logs/resnet18_cuda_h200.jsonl.gz \
                tuning_logs/mobilenet_v2_cuda_h200.jsonl.gz > /tmp/models-cuda.jsonl
            step peers 590 python3 benchmarks/e2e_gpu.py --models resnet18 mobilenet_v2 \
                --log /tmp/models-cuda.jsonl --out "$OUT/e2e_gpu_peers.json" ;;
        cputests) step cputests 300 python3 -m pytest -q -x tests/search/test_ops_sketch.py \
                      tests/graph/test_graph_compiler.py tests/search/test_search.py \
                      tests/models/test_models.py \
                      -rfE -p no:cacheprovider ;;
        convlayout) step convlayout 120 python3 benchmarks/cpu_conv_layout.py ;;
        e2e0) step e2e0 200 python3 benchmarks/e2e_gpu.py --no-compile ;;
        tune256) step tune256 590 python3 benchmarks/tune_gpu.py --trials 256 ${WL:+--workloads $WL} ;;
        corpus:*)  # corpus:<name>,<name>: match and time corpus models on cuda, untuned
            names=${s#corpus:}
            step corpus 300 python3 -m tests.support.corpus ${names//,/ } --target cuda ;;
        zero)  # the bundled H200 logs against untuned and cost-model-chosen schedules (issue 21)
            zcat tuning_logs/resnet18_cuda_h200.jsonl.gz \
                tuning_logs/mobilenet_v2_cuda_h200.jsonl.gz > /tmp/models-cuda.jsonl
            step zero 400 python3 benchmarks/e2e_gpu.py --models resnet18 mobilenet_v2 --zero \
                --log /tmp/models-cuda.jsonl --tf32 off --no-compile --rounds 3 \
                --out "$OUT/e2e_zero.json" ;;
        ctune:*)  # ctune:<name>,<name>: tune corpus models on cuda to 300 trials, $JOBS at a time
            # (their timed loops take turns on the GPU through the device lock), logs in
            # .gpu-logs (what an earlier call brought back, or carried gzipped in .gpu-logs-gz:
            # a log there is topped up), then $OUT/logs.tgz
            names=${s#ctune:}; unpack_logs
            printf '%s\n' ${names//,/ } | step ctune "${CTUNE_S:-560}" xargs -P "${JOBS:-4}" -I{} \
                python3 -m tests.support.corpus {} --target cuda --trials 300 --logs .gpu-logs \
                --no-time --timeout 900
            tar czf "$OUT/logs.tgz" .gpu-logs ;;
        ctime:*)  # ctime:<name>,<name>: each model untuned, with its .gpu-logs log (and with
            # zero-measurement schedules when $ZERO is set), against onnxruntime, one at a time;
            # a log whose choices predate the compiler's defaults is chosen again: the logs
            # come back in $OUT/logs.tgz. A model too large for one call travels packed
            # (benchmarks/corpus_carry.py) and is unpacked here first.
            names=${s#ctime:}; unpack_logs
            if [ -n "${AUTOSCHED_CORPUS_DIR:-}" ]; then
                python3 benchmarks/corpus_carry.py --unpack "$AUTOSCHED_CORPUS_DIR"
            fi
            step ctime "${CTIME_S:-560}" python3 -m tests.support.corpus ${names//,/ } --target cuda \
                --trials 300 --logs .gpu-logs ${ZERO:+--zero} --json "$OUT/ctime.json"
            tar czf "$OUT/logs.tgz" .gpu-logs ;;
        e2e20:*)  # e2e20:<model>: issue 20's rows of one model: batch 1 / 8 / 32 in fp32, tf32
            # and fp16 against torch (eager, compile, reduce-overhead); $LOG if set, else the
            # cost model's picks (compile's auto); $TAG names the run (say, implicit, with
            # AUTOSCHED_CONV_GEMM=implicit); $VARIANTS: e2e_gpu.py's --variant options;
            # CACHED=1: the picks of a carried .gpu-cache.tgz
            name=${s#e2e20:}
            step "e2e20-$name${TAG:+-$TAG}" "${E2E_S:-590}" python3 benchmarks/e2e_gpu.py \
                --models "$name" --batch ${BATCHES:-1 8 32} \
                --precision ${PRECISIONS:-fp32 tf32 fp16} --rounds 3 ${LOG:+--log "$LOG"} \
                ${VARIANTS:+$VARIANTS} ${CACHED:+--cached-picks} \
                --out "$OUT/e2e20_$name${TAG:+_$TAG}.json" ;;
        kernels:*)  # kernels:<model>: where its time goes, per kernel ($BATCHES, $PRECISIONS,
            # $LOG or $SCHEDULE)
            name=${s#kernels:}
            step "kernels-$name${TAG:+-$TAG}" "${KERNELS_S:-200}" python3 benchmarks/gpu_kernels.py \
                --models "$name" --batch ${BATCHES:-32} --precision ${PRECISIONS:-fp16} \
                ${LOG:+--log "$LOG"} ${SCHEDULE:+--schedule "$SCHEDULE"} ;;
        ray)  # issue 19: the Ray runner's candidates per minute over 1 and 2 worker nodes of
            # $RAY_CORES cores each, building on them with $RAY_NODE_BUILDS set, ResNet-18 at
            # $RAY_IMAGE pixels (default 224) (carry
            # .ray-bundle, which benchmarks/ray_bundle.sh builds: Ray's files as ray-slim.tar.xz
            # and its dependencies' wheels; xgboost comes with .gpu-wheels)
            tar xJf .ray-bundle/ray-slim.tar.xz -C /tmp/site \
                && python3 -m pip install -q --no-index --no-deps --target /tmp/site .ray-bundle/*.whl
            step ray "${RAY_S:-580}" python3 benchmarks/tune_ray.py --trials "${RAY_TRIALS:-400}" \
                --target "llvm -num-cores=${RAY_CORES:-4}" --node-cpus "${RAY_CORES:-4}" \
                ${RAY_NODE_BUILDS:+--node-builds} ${RAY_IMAGE:+--image "$RAY_IMAGE"} --nodes 1 2 \
                --out "$OUT/tune_ray.json" ;;
        stages) step stages 200 python3 benchmarks/gpu_hgemm_stages.py --sizes 4096 --stages 1 2 3 --rounds 5 ;;
        tiles) step tiles 400 python3 benchmarks/gpu_mma_tiles.py ${TILES:+--tiles $TILES} \
                   ${SHAPES:+--shapes $SHAPES} ;;
        wgmma)  # the wgmma main loop's tiles against cuBLAS ($WGMMA_ARGS: gpu_wgmma.py's options)
            step "wgmma${TAG:+-$TAG}" "${WGMMA_S:-300}" python3 benchmarks/gpu_wgmma.py \
                ${WGMMA_ARGS:-} ;;
        tma)  # the TMA main loops: their GPU tests, the copies side by side against cuBLAS, then
              # the BERT layer and ResNet-18 in fp16 with AUTOSCHED_TMA=1 as a variant
            step tma-tests 120 python3 -m pytest -q -m gpu tests/targets/cuda/test_wgmma.py \
                -rfE -p no:cacheprovider
            step tma-tiles 240 python3 benchmarks/gpu_wgmma.py --rounds 3 \
                --shapes gemm4096 l3_batch l1_batch --tiles 128x128w2s4 128x256w2s4 128x192w2s5 \
                --copies cp.async tma tma-ws
            step tma-e2e 420 python3 benchmarks/e2e_gpu.py --models bert_layer resnet18 \
                --batch 8 32 --precision fp16 --rounds 3 --cached-picks \
                --variant tma:AUTOSCHED_TMA=1 --out "$OUT/e2e20_tma.json" ;;
        issue20) # the GPU tests of the wgmma tiles (register epilogue, TMA) and of the row
            # kernels, the copies against cuBLAS, where the BERT layer's batch-32 time goes,
            # then both models against torch with TMA and without the K split as variants
            step i20-tests 150 python3 -m pytest -q -m gpu tests/targets/cuda/test_wgmma.py \
                tests/search/test_gpu_rows.py tests/search/test_gpu_cross_reduce.py \
                -rfE -p no:cacheprovider
            step i20-tiles 90 python3 benchmarks/gpu_wgmma.py --rounds 2 --repeat 20 \
                --shapes gemm4096 --tiles 128x256w2s4 128x192w2s5 --copies cp.async tma tma-ws
            step i20-kernels 80 python3 benchmarks/gpu_kernels.py --models bert_layer --batch 32 \
                --precision fp16 --top 26
            for m in bert_layer resnet18; do
                step "i20-e2e-$m" 170 python3 benchmarks/e2e_gpu.py --models "$m" --batch 8 32 \
                    --precision fp16 --rounds 2 --cached-picks --variant tma:AUTOSCHED_TMA=1 \
                    --variant nosplit:AUTOSCHED_K_SPLIT=1 --out "$OUT/e2e20_$m.json"
            done ;;
        hgemm) step hgemm 400 python3 benchmarks/gpu_hgemm.py --sizes 1024 4096 --trials 64 ;;
        *) echo "unknown step $s" ;;
    esac
done
