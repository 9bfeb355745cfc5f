set terminal pngcairo size 800,480
set output 'ab.png'
set title "bench batch, 512-token histories, 128 new (AMD EPYC VM, 2 cores, load 4.3-5.1)"
set xlabel 'streams'; set ylabel 'aggregate tok/s'; set key left top; set xrange [3:9]; set yrange [0:*]
plot 'ab.dat' using ($3-0.1):(stringcolumn(2) eq 'new' ? $4 : 1/0) with points pt 7 ps 1.5 title 'one graph a step (s36-batch)', \
     'ab.dat' using ($3+0.1):(stringcolumn(2) eq 'old' ? $4 : 1/0) with points pt 5 ps 1.5 title 'layer by layer (main 066a903)', \
     '-' using 1:2 with linespoints pt 9 ps 1.5 title 'llama-batched-bench S\\_TG (same run)'
4 30.77
8 60.42
e
