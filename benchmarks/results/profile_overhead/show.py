import json,sys
r=json.loads(open(sys.argv[1]).read())
print({k:r[k] for k in ('variant','seconds','cpu_seconds','images_per_cpu_second','engine_stats','skipped_fraction')})
for t,d in r['timers'].items():
  print('==',t)
  for n,v in d.items(): print(f'{n:45s} cpu {v["cpu_s"]:8.3f} wall {v["wall_s"]:8.3f} calls {v["calls"]:6d} share {v["cpu_share"]:.3f}')
ph=r.get('phases') or {}
for kind,e in ph.items():
  print(kind, e['iterations'], 'cpu_ms', e['cpu_ms'])
