set terminal pngcairo size 900,500
set output 'bench-pool-ttft.png'
set xlabel 'query'
set ylabel 'TTFT (s)'
set y2label 'KV resident at return'
set y2tics
set key top left
plot 'bench-pool-ttft.dat' u 1:2 w lp t 'return after other conversations', '' u 1:3 w lp t 'all in memory (next query)', '' u 1:4 axes x1y2 w i t 'KV resident share'
