#define _GNU_SOURCE
#include <sys/mman.h>
#include <fcntl.h>
#include <stdio.h>
#include <time.h>
#include <sys/resource.h>
#include <stdlib.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static double cpu(){struct rusage r;getrusage(RUSAGE_SELF,&r);return r.ru_utime.tv_sec+r.ru_stime.tv_sec+1e-6*(r.ru_utime.tv_usec+r.ru_stime.tv_usec);}
static double sys_all(){FILE*f=fopen("/proc/stat","r");char b[256];double u,n,s,i,w,q,sq;fscanf(f,"%s %lf %lf %lf %lf %lf %lf %lf",b,&u,&n,&s,&i,&w,&q,&sq);fclose(f);return (u+n+s+q+sq)/100.0;}
int main(int c,char**v){int fd=open(v[1],O_RDONLY);size_t off=(size_t)atoll(v[2])<<20, n=(size_t)atoll(v[3])<<20; size_t L=(size_t)atoll(v[4])<<20; int reps=atoi(v[5]);
 const char*names[]={"cur: rand+wn4M/layer","normal/layer","seq/layer","normal+wn-all/layer","normal+wn8Mpieces","rand+wn8Mpieces"};
 for(int r=0;r<reps;r++) for(int mode=0;mode<6;mode++){
  posix_fadvise(fd,off,n,POSIX_FADV_DONTNEED);
  double t=now(),c0=cpu(),s0=sys_all(); int rc=0;
  char*maps[256];int nm=0; for(size_t lo=0;lo<n;lo+=L){ size_t m=n-lo<L?n-lo:L; char*p=maps[nm++]=mmap(0,m,PROT_READ,MAP_PRIVATE,fd,off+lo);
   if(mode==0){ size_t W=4<<20; madvise(p,m,MADV_RANDOM); madvise(p,W<m?W:m,MADV_WILLNEED);
    for(size_t o=0;o<m;o+=W){ size_t k=m-o<W?m-o:W; if(o+k<m) madvise(p+o+k,(m-o-k)<W?(m-o-k):W,MADV_WILLNEED); rc|=madvise(p+o,k,22);} }
   else if(mode>=4){ madvise(p,m,mode==4?MADV_NORMAL:MADV_RANDOM); for(size_t o=0;o<m;o+=8<<20) madvise(p+o,(m-o)<(8u<<20)?(m-o):(8u<<20),MADV_WILLNEED); rc|=madvise(p,m,22);}
   else { madvise(p,m,mode==2?MADV_SEQUENTIAL:MADV_NORMAL); if(mode==3) madvise(p,m,MADV_WILLNEED); rc|=madvise(p,m,22);}
  }
  double d=now()-t,cp=cpu()-c0,sa=sys_all()-s0;
  for(int i=0;i<nm;i++){size_t lo=(size_t)i*L; munmap(maps[i], n-lo<L?n-lo:L);}
  printf("%-22s rc %d %.3f s %.2f GB/s own cpu %.3f, all cpus busy %.3f s\n",names[mode],rc,d,n/d/1e9,cp,sa); fflush(stdout);
 }
}
