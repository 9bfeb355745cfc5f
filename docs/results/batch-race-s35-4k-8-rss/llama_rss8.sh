#!/bin/bash
# llama-server -np 8 with the context 8 streams of 4k-token histories need (as batch_race sets it:
# ctx/seq 5376), q8_0 KV, flash attention: RSS after load, after one short request; its buffer sizes.
LS=/root/.cache/mzcache/deps/node-llama-cpp-3.21.1-d6a49d993c27/install/bin/llama-server
O=/tmp/s35-race4k/llama-rss8; mkdir -p $O
$LS -m ~/.cache/mzcache/models/qwen3-0.6b-q8_0.gguf --host 127.0.0.1 --port 18932 -t 2 -tb 2 -np 8 -c 43008 --no-webui --no-jinja -ctk q8_0 -ctv q8_0 -fa on > $O/server.log 2>&1 &
P=$!
for i in $(seq 300); do curl -sf localhost:18932/health >/dev/null && break; sleep 0.2; done
rss() { grep -E "VmRSS|VmHWM|RssAnon|RssFile" /proc/$P/status | tr -s ' \t' ' ' | tr '\n' ';'; }
echo "after load: $(rss)"
curl -s localhost:18932/completion -d '{"prompt":"The king said","n_predict":8,"temperature":0.8,"seed":1,"chat_parser":"{\"parsers\":[{\"type\":\"epsilon\"}],\"rules\":{},\"root\":0}"}' | grep -o '"tokens_predicted":[0-9]*'
echo "after one short request: $(rss)"
kill $P; wait $P 2>/dev/null
grep -iE "KV buffer size|compute buffer size|n_ctx|kv_unified|n_seq_max|model buffer size" $O/server.log | cut -c1-200
