set terminal pngcairo noenhanced size 900,500
set output 'peers-qwen3-0.6b-q8_0-8192.png'
set title 'TTFT, qwen3-0.6b-q8_0, 8192-token context, 8-token query'
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set ylabel 'TTFT (s)'
set xlabel 'scenario (restart, or remaining in memory under pressure)' offset 0,-1
set bmargin 5
set logscale y
set yrange [0.01:*]
set key top right
plot 'peers-qwen3-0.6b-q8_0-8192.dat' u 2:xtic(1) t 'mzcache', '' u 3 t 'peer (llama.cpp)'
