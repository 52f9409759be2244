// One core's eight-wide FMA rate (ten independent chains): gcc -O2 -mavx2 -mfma -o fmapeak fmapeak.c && ./fmapeak
// (the thirty-seventh session's dev VM, AMD EPYC Zen 3: 7.49 and 7.62 G vector FMA/s in two runs)
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
  __m256 a0=_mm256_set1_ps(1.0f),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0,a8=a0,a9=a0;
  __m256 b=_mm256_set1_ps(0.999999f), c=_mm256_set1_ps(1e-7f);
  long n=200000000; double t0=now();
  for(long i=0;i<n;i++){
    a0=_mm256_fmadd_ps(a0,b,c);a1=_mm256_fmadd_ps(a1,b,c);a2=_mm256_fmadd_ps(a2,b,c);a3=_mm256_fmadd_ps(a3,b,c);a4=_mm256_fmadd_ps(a4,b,c);
    a5=_mm256_fmadd_ps(a5,b,c);a6=_mm256_fmadd_ps(a6,b,c);a7=_mm256_fmadd_ps(a7,b,c);a8=_mm256_fmadd_ps(a8,b,c);a9=_mm256_fmadd_ps(a9,b,c);
  }
  double t=now()-t0;
  __m256 s=_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0,a1),_mm256_add_ps(a2,a3)),_mm256_add_ps(_mm256_add_ps(a4,a5),_mm256_add_ps(a6,a7)));
  s=_mm256_add_ps(s,_mm256_add_ps(a8,a9)); float o[8]; _mm256_storeu_ps(o,s);
  printf("%.2f G vector FMA/s per core (%.1f GFLOP/s fp32), chk %f\n", n*10/t/1e9, n*10*16/t/1e9, o[0]);
}
