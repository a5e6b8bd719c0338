import ReactEChartsCore from 'echarts-for-react/esm/core';
import { BarChart, LineChart } from 'echarts/charts';
import { AriaComponent, GridComponent, LegendComponent, TooltipComponent } from 'echarts/components';
import * as echarts from 'echarts/core';
import { CanvasRenderer } from 'echarts/renderers';
import type { EChartsOption } from 'echarts';

// Only what the console draws, so the bundle carries a fraction of ECharts.
echarts.use([AriaComponent, BarChart, LineChart, GridComponent, LegendComponent, TooltipComponent, CanvasRenderer]);

export function Chart({ option, height = 320, testId }: { option: EChartsOption; height?: number; testId?: string }) {
  return (
    <div data-testid={testId}>
      {/*
        Merged, so the legend keeps what the operator switched off; but a series missing from the
        new option is removed (matched by id), not left drawn with its last data and named in the
        legend, as a merge alone leaves it.
      */}
      <ReactEChartsCore echarts={echarts} option={option} style={{ height }} notMerge={false} replaceMerge={['series']} lazyUpdate />
    </div>
  );
}
