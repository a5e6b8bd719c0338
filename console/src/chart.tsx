import { useEffect, useRef } from 'react';
import ReactEChartsCore from 'echarts-for-react/esm/core';
import { BarChart, LineChart } from 'echarts/charts';
import { AriaComponent, GridComponent, LegendComponent, TooltipComponent } from 'echarts/components';
import * as echarts from 'echarts/core';
import { CanvasRenderer } from 'echarts/renderers';
import type { EChartsOption } from 'echarts';

// Only what the console draws, so the bundle carries a fraction of ECharts.
echarts.use([AriaComponent, BarChart, LineChart, GridComponent, LegendComponent, TooltipComponent, CanvasRenderer]);

export function Chart({ option, height = 320, testId }: { option: EChartsOption; height?: number; testId?: string }) {
  const box = useRef<HTMLDivElement>(null);
  const chart = useRef<ReactEChartsCore>(null);
  // echarts-for-react creates the chart at the width its box has once first drawn, in pixels, and
  // drops the first size change its own observer reports after that as the "initial" one: a change
  // under way then (the page still laying out, the menu folding) is debounced into that one call
  // and lost, and the canvas keeps its first width, wider than its card or narrower. Our observer
  // reports every change, whenever it comes.
  useEffect(() => {
    const element = box.current;
    if (!element) return;
    const observer = new ResizeObserver(() => chart.current?.getEchartsInstance()?.resize({ width: 'auto', height: 'auto' }));
    observer.observe(element);
    return () => observer.disconnect();
  }, []);
  return (
    <div ref={box} data-testid={testId}>
      {/*
        Merged, so the legend keeps what the operator switched off; but a series missing from the
        new option is removed (matched by id), not left drawn with its last data and named in the
        legend, as a merge alone leaves it.
      */}
      <ReactEChartsCore
        ref={chart}
        echarts={echarts}
        option={option}
        style={{ height }}
        notMerge={false}
        replaceMerge={['series']}
        lazyUpdate
      />
    </div>
  );
}
