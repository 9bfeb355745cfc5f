set terminal pngcairo size 1000,500
set output 'footprint.png'
set title 'Memory footprint per model shape'
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set ylabel 'GiB'
set yrange [0:*]
set key top left
set xtics rotate by -20
plot 'footprint.dat' u 2:xtic(1) t 'weights f16', '' u 3 t 'weights q8\_0', '' u 4 t 'KV 8k', '' u 5 t 'KV 16k', '' u 6 t 'KV 32k'
