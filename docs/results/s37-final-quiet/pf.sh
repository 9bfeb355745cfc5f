#!/bin/bash
# prefill TTFT A/B through serve: new conversation each time, ~650-token prompt, max_tokens 1
T=/root/.cache/mzcache/text/kjv.txt
for rep in 1 2; do
for b in merged main; do
  d=$(mktemp -d); port=$((18100+RANDOM%500))
  nice -n -5 /tmp/s37/mzcache-$b serve -m /root/.cache/mzcache/models/qwen3-0.6b-q8_0.gguf --port $port --pool-dir $d -t 2 > $d/log 2>&1 &
  pid=$!; for i in $(seq 50); do curl -s localhost:$port/health | grep -q ok && break; sleep 0.2; done
  out=""
  for k in 1 2 3; do
    off=$(( (rep*7+k*13+RANDOM) % 20000 + 1 ))
    txt=$(tail -n +$off $T | head -c 2600 | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')
    s=$(date +%s.%N); curl -s localhost:$port/v1/completions -d "{\"prompt\":$txt,\"max_tokens\":1}" > $d/r.json; e=$(date +%s.%N)
    out="$out $(python3 -c "import json;d=json.load(open('$d/r.json'));print(round($e-$s,3), d['usage']['prompt_tokens'])")"
  done
  echo "$b rep$rep:$out load $(cut -d' ' -f1 /proc/loadavg)"
  kill $pid; wait $pid 2>/dev/null; rm -rf $d
done; done
