set terminal pngcairo size 1000,550
set output 'bench-field-notes-rss.png'
set title 'RSS of the LLM process in the 8 GB phone (camera in/out: dashed)'
set xlabel 'seconds since the process started'
set ylabel 'MiB'
set key outside right
set arrow from 34.9, graph 0 to 34.9, graph 1 nohead dt 2
set arrow from 49.9, graph 0 to 49.9, graph 1 nohead dt 3
set arrow from 16.6, graph 0 to 16.6, graph 1 nohead dt 2
set arrow from 62.5, graph 0 to 62.5, graph 1 nohead dt 3
set arrow from 27.1, graph 0 to 27.1, graph 1 nohead dt 2
set arrow from 67.3, graph 0 to 67.3, graph 1 nohead dt 3
plot 'bench-field-notes-rss.dat' index 0 using 1:2 with lines lw 2 title 'llama-repack r1', 'bench-field-notes-rss.dat' index 1 using 1:2 with lines lw 2 title 'llama-no-repack r1', 'bench-field-notes-rss.dat' index 2 using 1:2 with lines lw 2 title 'mzcache r1', 'bench-field-notes-rss.dat' index 3 using 1:2 with lines lw 2 title 'llama-no-repack r2', 'bench-field-notes-rss.dat' index 4 using 1:2 with lines lw 2 title 'mzcache r2', 'bench-field-notes-rss.dat' index 5 using 1:2 with lines lw 2 title 'llama-repack r2'
