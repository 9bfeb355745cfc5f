set terminal pngcairo size 900,500
set output 'fig34.png'
set title 'TTFT from 0% remaining, normalized to all-in-memory'
set style data histograms
set style histogram rowstacked
set style fill solid 0.8 border -1
set boxwidth 0.35
set ylabel 'TTFT / all-in-memory TTFT'
set key top left
set xtics rotate by -20
plot 'fig34.dat' u 2:xtic(1) t 'allocation', '' u 3 t 'storage read', '' u 4 t 'prefill', '' u 0:($5>0?$5:1/0) w p pt 7 ps 1.5 t 'OS Paging (total)'
