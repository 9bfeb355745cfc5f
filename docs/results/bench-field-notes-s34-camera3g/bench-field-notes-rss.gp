set terminal pngcairo size 1000,550
set output 'bench-field-notes-rss.png'
set title 'RSS of the LLM process in the 8 GB phone (camera in/out: dashed)'
set xlabel 'seconds since the process started'
set ylabel 'MiB'
set key outside right
set arrow from 35.8, graph 0 to 35.8, graph 1 nohead dt 2
set arrow from 83.8, graph 0 to 83.8, graph 1 nohead dt 3
set arrow from 27.7, graph 0 to 27.7, graph 1 nohead dt 2
set arrow from 72.0, graph 0 to 72.0, graph 1 nohead dt 3
plot 'bench-field-notes-rss.dat' index 0 using 1:2 with lines lw 2 title 'llama-repack r1', 'bench-field-notes-rss.dat' index 1 using 1:2 with lines lw 2 title 'mzcache r1'
