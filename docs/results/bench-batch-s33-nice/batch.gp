set terminal pngcairo size 800,500
set output 'batch.png'
set xlabel 'concurrent streams'
set ylabel 'aggregate decode tokens/s'
set key left top
set grid
set logscale x 2
set title 'Many users at once (Qwen3-0.6B (mzcache synthetic, random weights), 2 threads)'
plot 'batch.dat' using 1:2:3:4 with yerrorlines title 'batched'
