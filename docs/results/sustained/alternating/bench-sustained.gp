set terminal pngcairo size 900,500
set output 'bench-sustained.png'
set xlabel 'seconds into the generation'
set ylabel 'tokens/s (per window)'
set yrange [0:*]
set key bottom right
set grid
plot 'bench-sustained-baseline.dat' u 1:2 w lp pt 7 ps 0.4 t 'baseline', 'bench-sustained-sustained.dat' u 1:2 w lp pt 5 ps 0.4 t 'sustained (thread cap 1, duty 0.70)'
