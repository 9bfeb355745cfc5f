set terminal pngcairo size 900,500
set output 'bench-models-ttft.png'
set title 'TTFT of the first request after a model switch'
set xlabel 'request (switch)'
set ylabel 'TTFT (s)'
set key top left
plot 'bench-models.dat' index 0 using 1:2 with linespoints title 'mzcache', 'bench-models.dat' index 1 using 1:2 with linespoints title 'mzcache-behind', 'bench-models.dat' index 2 using 1:2 with linespoints title 'all-in-memory'
