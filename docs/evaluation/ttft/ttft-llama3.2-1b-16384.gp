set terminal pngcairo size 800,500
set output 'ttft-llama3.2-1b-16384.png'
set title 'TTFT, llama3.2-1b, 16384-token context, 8-token query'
set xlabel 'remaining in memory (%)'
set ylabel 'TTFT (s)'
set key top right
set xrange [-5:80]
set yrange [0:*]
plot 'ttft-llama3.2-1b-16384.dat' u 1:2:3:4 w yerrorlines t 'mzcache', '' u 1:5:6:7 w yerrorlines t 'Partial Offload', '' u 1:9:10:11 w yerrorlines t 'OS Paging (zram)', '' u 1:8 w lp dt 2 t 'lower bound', 0.346777 w l dt 3 t 'all in memory'
